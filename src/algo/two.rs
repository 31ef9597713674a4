//! A policy of one quota kept in two words (a fixed window, a sliding-window counter or a
//! warm-up quota): each kind's decision on its own ([`TwoKind`]), and a key's slot ([`Two`]),
//! its two words changed as one without a lock.
//!
//! # Implementation details
//! The two words do not fit one compare-and-swap, as GCRA's one word does, while their range
//! stays exact (a window opens at its key's first request, any nanosecond of the clock). They
//! sit beside a sequence number instead, made of atomics as a sequence lock is: a check reads
//! the number (even), the words and the number again, and decides on the words only when
//! nothing changed between; a check that changes them (an admission, a refund, a charge)
//! claims the number (even to odd) by compare-and-swap from the reading it decided on, so that
//! a change made by another thread meanwhile makes it decide again, then writes the words and
//! the key's idle time and releases the number (odd to the next even). A check that changes
//! nothing (a rejection, a peek) writes nothing. No check waits on another's arithmetic: only
//! the three stores between the claim and the release exclude others.

use std::sync::atomic::{fence, AtomicU64, Ordering};

use super::log::Log;
use super::step::{Slot, Step, Words};
use super::warmup::{WarmGcra, WarmState};
use super::{Gcra, Rule, Window};
use crate::decision::{Decision, QuotaState, Reservation};

/// One quota kept in two words, of a kind known where it is used: its step, its figures and
/// its idle time. [`Rule`] is every kind at once (one match each); [`Fixed`], [`Counter`] and
/// [`WarmGcra`] are one kind each, so that a check that read the kind once decides with no
/// other match on it.
pub(crate) trait TwoKind {
    /// Decides a request of `cost` at `now` for a key in state `words`.
    fn step(&self, words: Words, now: u64, cost: u32) -> Step;
    /// The figures of the quota for a key in state `words` at `now`.
    fn state(&self, words: Words, now: u64) -> QuotaState;
    /// When a key in state `words` becomes equal to one never seen.
    fn idle_at(&self, words: Words) -> u64;
    /// The quota as a [`Rule`].
    fn rule(&self) -> Rule;
    /// [`step`](Self::step), and the [`state`](Self::state) of the words it leaves (kept
    /// only when admitted at a cost): a kind may share the work of both.
    #[inline]
    fn judge(&self, words: Words, now: u64, cost: u32) -> (Step, QuotaState) {
        let step = self.step(words, now, cost);
        let after = kept(&step, cost).unwrap_or(words);
        (step, self.state(after, now))
    }
    /// [`judge`](Self::judge), the words it keeps (none: the words stay) and the
    /// [`idle_at`](Self::idle_at) of the words after it: a kind may share the work of all
    /// three.
    #[inline(always)]
    fn judge_kept(&self, words: Words, now: u64, cost: u32) -> Judged {
        let judged = self.judge(words, now, cost);
        let after = kept(&judged.0, cost);
        let idle = self.idle_at(after.unwrap_or(words));
        (judged, after, idle)
    }
}

/// What [`TwoKind::judge_kept`] says: the step and the quota's figures after it, the words
/// kept (none: the words stay) and the time the key becomes idle with the words after it.
pub(crate) type Judged = ((Step, QuotaState), Option<Words>, u64);

/// The words a step keeps: those it admitted at a cost, otherwise none (the words stay).
#[inline]
pub(super) fn kept(step: &Step, cost: u32) -> Option<Words> {
    match step {
        Step::Allow { words, .. } if cost > 0 => Some(*words),
        _ => None,
    }
}

impl TwoKind for Rule {
    #[inline]
    fn step(&self, words: Words, now: u64, cost: u32) -> Step {
        debug_assert!(self.in_two_words());
        Rule::step(self, words, &Log::EMPTY, now, cost)
    }

    #[inline]
    fn state(&self, words: Words, now: u64) -> QuotaState {
        Rule::state(self, words, &Log::EMPTY, now)
    }

    #[inline]
    fn idle_at(&self, words: Words) -> u64 {
        self.idle_at_two(words)
    }

    fn rule(&self) -> Rule {
        *self
    }
}

/// A GCRA quota, in the first of its two words (see [`Gcra`]): as one quota among the
/// kinds of a policy decided together.
impl TwoKind for Gcra {
    #[inline]
    fn step(&self, words: Words, now: u64, cost: u32) -> Step {
        Gcra::step(self, words[0], now, cost)
    }

    #[inline]
    fn state(&self, words: Words, now: u64) -> QuotaState {
        QuotaState::of(self, words[0], now)
    }

    #[inline]
    fn idle_at(&self, words: Words) -> u64 {
        words[0]
    }

    fn rule(&self) -> Rule {
        Rule::Gcra(*self)
    }
}

/// A fixed-window quota (see [`Window`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fixed(pub(crate) Window);

impl TwoKind for Fixed {
    #[inline]
    fn step(&self, words: Words, now: u64, cost: u32) -> Step {
        self.0.fixed_step(words, now, cost)
    }

    #[inline]
    fn state(&self, words: Words, now: u64) -> QuotaState {
        self.0.fixed_state(words, now)
    }

    #[inline]
    fn idle_at(&self, words: Words) -> u64 {
        self.0.fixed_idle_at(words)
    }

    fn rule(&self) -> Rule {
        Rule::FixedWindow(self.0)
    }
}

/// A sliding-window counter quota (see [`Window`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Counter(pub(crate) Window);

impl TwoKind for Counter {
    #[inline]
    fn step(&self, words: Words, now: u64, cost: u32) -> Step {
        self.0.counter_step(words, now, cost)
    }

    #[inline]
    fn state(&self, words: Words, now: u64) -> QuotaState {
        self.0.counter_state(words, now)
    }

    #[inline]
    fn idle_at(&self, words: Words) -> u64 {
        self.0.counter_idle_at(words)
    }

    #[inline(always)]
    fn judge(&self, words: Words, now: u64, cost: u32) -> (Step, QuotaState) {
        self.0.counter_judge(words, now, cost)
    }

    #[inline(always)]
    fn judge_kept(&self, words: Words, now: u64, cost: u32) -> Judged {
        match self.0.counter_in_window(words, now, cost) {
            Some(judged) => judged,
            None => self.judge_kept_slow(words, now, cost),
        }
    }

    fn rule(&self) -> Rule {
        Rule::SlidingWindow(self.0)
    }
}

impl Counter {
    /// [`TwoKind::judge_kept`] the general way.
    #[inline(always)]
    fn judge_kept_slow(&self, words: Words, now: u64, cost: u32) -> Judged {
        let judged = self.0.counter_judge(words, now, cost);
        let after = kept(&judged.0, cost);
        let idle = self.0.counter_idle_at(after.unwrap_or(words));
        (judged, after, idle)
    }
}

/// Words `[tat, deficit]`.
#[inline]
pub(super) fn warm(words: Words) -> WarmState {
    WarmState {
        tat: words[0],
        deficit: words[1],
    }
}

impl TwoKind for WarmGcra {
    #[inline]
    fn step(&self, words: Words, now: u64, cost: u32) -> Step {
        WarmGcra::step(self, warm(words), now, cost)
    }

    #[inline]
    fn state(&self, words: Words, now: u64) -> QuotaState {
        WarmGcra::state(self, warm(words), now)
    }

    #[inline]
    fn idle_at(&self, words: Words) -> u64 {
        WarmGcra::idle_at(self, warm(words))
    }

    #[inline(always)]
    fn judge(&self, words: Words, now: u64, cost: u32) -> (Step, QuotaState) {
        let (step, state, _) = self.judged(warm(words), now, cost);
        (step, state)
    }

    #[inline(always)]
    fn judge_kept(&self, words: Words, now: u64, cost: u32) -> Judged {
        let (step, state, after) = self.judged(warm(words), now, cost);
        let idle = match after {
            Some(after) => WarmGcra::idle_at(self, after),
            None => WarmGcra::idle_at(self, warm(words)),
        };
        ((step, state), after.map(|a| [a.tat, a.deficit]), idle)
    }

    fn rule(&self) -> Rule {
        Rule::WarmUp(*self)
    }
}

/// What is done with one quota kept in two words, of whichever kind it is: the one place
/// that picks the kind ([`TwoQuota::with`]) calls [`with`](Self::with) with that kind.
pub(crate) trait WithKind {
    type Out;
    fn with<R: TwoKind>(self, rule: &R) -> Self::Out;
}

/// One quota kept in two words, other than GCRA, read with its kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TwoQuota {
    Fixed(Fixed),
    Counter(Counter),
    Warm(WarmGcra),
}

const TAG_FIXED_WINDOW: u64 = 1;
const TAG_SLIDING_WINDOW: u64 = 2;
const TAG_WARM_UP: u64 = 3;

/// How many words [`TwoQuota::words`] gives: a warm-up quota's, the most of the kinds.
pub(crate) const QUOTA_WORDS: usize = 10;

impl TwoQuota {
    /// The quota of `rule`, when it is a fixed window, a sliding counter or a warm-up quota.
    pub(crate) fn of(rule: &Rule) -> Option<TwoQuota> {
        match rule {
            Rule::FixedWindow(w) => Some(TwoQuota::Fixed(Fixed(*w))),
            Rule::SlidingWindow(w) => Some(TwoQuota::Counter(Counter(*w))),
            Rule::WarmUp(g) => Some(TwoQuota::Warm(*g)),
            Rule::Gcra(_) | Rule::SlidingLog(_) => None,
        }
    }

    /// The quota as a tag and words, to keep a copy in atomics: [`from_words`](Self::from_words)
    /// gives it back. The tag is never 0, which gives back none.
    pub(crate) fn words(&self) -> (u64, [u64; QUOTA_WORDS]) {
        let mut out = [0; QUOTA_WORDS];
        let tag = match self {
            TwoQuota::Fixed(Fixed(w)) => {
                out[..4].copy_from_slice(&w.words());
                TAG_FIXED_WINDOW
            }
            TwoQuota::Counter(Counter(w)) => {
                out[..4].copy_from_slice(&w.words());
                TAG_SLIDING_WINDOW
            }
            TwoQuota::Warm(g) => {
                out.copy_from_slice(&g.words());
                TAG_WARM_UP
            }
        };
        (tag, out)
    }

    /// `v` with the quota whose [`words`](Self::words) are `tag` and `word(0)`, `word(1)`,
    /// …, as its own kind, if `whole()` says, once they are read, that they were read
    /// whole; `otherwise(v)` for the tag 0 or words not read whole. Only the words of its
    /// kind are read, each kind in its own arm, so that the quota is never kept as a whole
    /// enum, and every arm returns where its caller keeps what it returns.
    #[inline]
    pub(crate) fn with_words<V: WithKind>(
        tag: u64,
        word: impl Fn(usize) -> u64,
        whole: impl FnOnce() -> bool,
        v: V,
        otherwise: impl FnOnce(V) -> V::Out,
    ) -> V::Out {
        let window = || Window::from_words([word(0), word(1), word(2), word(3)]);
        match tag {
            TAG_FIXED_WINDOW => {
                let rule = Fixed(window());
                if whole() {
                    return v.with(&rule);
                }
            }
            TAG_SLIDING_WINDOW => {
                let rule = Counter(window());
                if whole() {
                    return v.with(&rule);
                }
            }
            TAG_WARM_UP => {
                let rule = WarmGcra::from_words(std::array::from_fn(word));
                if whole() {
                    return v.with(&rule);
                }
            }
            _ => {}
        }
        otherwise(v)
    }

    /// The quota as a [`Rule`].
    #[cfg(test)]
    pub(crate) fn rule(&self) -> Rule {
        match self {
            TwoQuota::Fixed(r) => r.rule(),
            TwoQuota::Counter(r) => r.rule(),
            TwoQuota::Warm(r) => r.rule(),
        }
    }
}

/// Reads a quota back as a [`Rule`].
#[cfg(test)]
pub(crate) struct AsRule;

#[cfg(test)]
impl WithKind for AsRule {
    type Out = Option<Rule>;
    fn with<R: TwoKind>(self, rule: &R) -> Option<Rule> {
        Some(rule.rule())
    }
}

/// The decision of a policy of one quota kept in two words on a key in state `words`, which
/// it updates when the request is admitted: [`decide`](super::decide) without a log. Returns
/// the decision and whether `words` changed.
#[inline]
pub(crate) fn decide_two(
    rule: &impl TwoKind,
    words: &mut Words,
    now: u64,
    cost: u32,
) -> (Decision, bool) {
    let judged = rule.judge(*words, now, cost);
    let after = kept(&judged.0, cost);
    if let Some(after) = after {
        *words = after;
    }
    (decision_two(judged, cost), after.is_some())
}

/// The decision of a step and the quota's figures after it ([`TwoKind::judge`]): built
/// where its caller keeps it, once the key's words are settled.
#[inline(always)]
pub(crate) fn decision_two((step, state): (Step, QuotaState), cost: u32) -> Decision {
    let (outcome, retry_after, taken) = step.alone(cost);
    // Each word is chosen here and written once (as a one-GCRA decision is), so that the
    // decision is written in place rather than assembled elsewhere and copied.
    let rest = QuotaState::default();
    let quotas = [state, rest, rest, rest];
    Decision::new(outcome, retry_after, quotas, 1, taken)
}

/// A key's slot under a policy of one quota kept in two words (see the module documentation):
/// a quarter of the memory of the general state, and no loop over quotas nor log to read. The
/// kinds of a policy never change while it serves, so its keys keep this slot for as long as
/// it serves. The time the key becomes idle is kept beside the words, for the table to read
/// without the quota.
pub(crate) struct Two {
    /// Even while `words` and `horizon` are settled; odd while a change writes them.
    seq: AtomicU64,
    words: [AtomicU64; 2],
    horizon: AtomicU64,
}

impl Two {
    pub(crate) fn idle() -> Self {
        Two::kept([0; 2], 0)
    }

    fn kept(words: Words, horizon: u64) -> Self {
        Two {
            seq: AtomicU64::new(0),
            words: [AtomicU64::new(words[0]), AtomicU64::new(words[1])],
            horizon: AtomicU64::new(horizon),
        }
    }

    /// The slot of a key in state `words` under `rule`.
    fn made(rule: &impl TwoKind, words: Words) -> Self {
        Two::kept(words, rule.idle_at(words))
    }

    /// Reads the key's words and decides through `f` what to keep in their place (none:
    /// leave them), as one change: `f` always decides on words that were the key's together,
    /// and a change another thread made meanwhile makes it decide again on that one's words.
    /// The time the key becomes idle (`idle_at` of the words kept) is kept with them, and
    /// made again when the words are left but it was made under other rules. Returns what `f`
    /// said last and the words after it.
    #[inline(always)]
    fn update<T>(
        &self,
        idle_at: impl Fn(Words) -> u64,
        mut f: impl FnMut(Words) -> (T, Option<Words>),
    ) -> (T, Words) {
        self.update_idle(|words| {
            let (said, new) = f(words);
            let idle = idle_at(new.unwrap_or(words));
            (said, new, idle)
        })
    }

    /// [`update`](Self::update), with `f` saying the idle time of the words after it too.
    #[inline(always)]
    fn update_idle<T>(&self, mut f: impl FnMut(Words) -> (T, Option<Words>, u64)) -> (T, Words) {
        let mut spins = 0;
        loop {
            let seq = self.seq.load(Ordering::Acquire);
            let words = [
                self.words[0].load(Ordering::Relaxed),
                self.words[1].load(Ordering::Relaxed),
            ];
            let horizon = self.horizon.load(Ordering::Relaxed);
            // Orders the loads of the words before the second reading of the number: words
            // a change wrote are seen with the odd number it wrote first, or a later one.
            fence(Ordering::Acquire);
            if seq & 1 == 0 && self.seq.load(Ordering::Relaxed) == seq {
                let (said, new, idle) = f(words);
                let kept = new.unwrap_or(words);
                if kept == words && idle == horizon {
                    return (said, words);
                }
                if self.write(seq, kept, idle) {
                    return (said, kept);
                }
            }
            wait(&mut spins);
        }
    }

    /// Writes `words` and their idle time `horizon`, unless the number has moved from `seq`
    /// (another change came first); whether it wrote.
    #[inline]
    fn write(&self, seq: u64, words: Words, horizon: u64) -> bool {
        if self
            .seq
            .compare_exchange(seq, seq + 1, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return false;
        }
        // Orders the odd number before the words: a reader that sees a new word sees it.
        fence(Ordering::Release);
        self.words[0].store(words[0], Ordering::Relaxed);
        self.words[1].store(words[1], Ordering::Relaxed);
        self.horizon.store(horizon, Ordering::Release);
        self.seq.store(seq + 2, Ordering::Release);
        true
    }

    /// Decides a request of `cost` at `now` under `rule`, of its own kind: the step and the
    /// quota's figures after it, for [`decision_two`].
    #[inline(always)]
    pub(crate) fn step_kind(&self, rule: &impl TwoKind, now: u64, cost: u32) -> (Step, QuotaState) {
        self.update_idle(
            #[inline(always)]
            |words| rule.judge_kept(words, now, cost),
        )
        .0
    }

    /// Makes the key one never seen if it is idle at `now` under `rule` (judged from its
    /// words, not from the idle time kept beside them, which an earlier quota may have set);
    /// whether it did.
    pub(crate) fn renew_if_idle(&self, rule: &Rule, now: u64) -> bool {
        self.update(
            |w| rule.idle_at_two(w),
            |w| {
                let idle = rule.idle_at_two(w) <= now;
                (idle, idle.then_some([0; 2]))
            },
        )
        .0
    }
}

/// Waits a little for a change being written by another thread: a few spins, then a yield
/// (the writer may have been preempted within its three stores).
#[cold]
fn wait(spins: &mut u32) {
    if *spins < 64 {
        *spins += 1;
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}

impl Slot for Two {
    type Rules = Rule;
    /// The step, and the quota's figures after it: the decision (many words) is built from
    /// them where the caller keeps it.
    type Said = (Step, QuotaState);

    fn decide_absent(rule: &Rule, now: u64, cost: u32) -> (Decision, Option<Self>) {
        let mut words = [0; 2];
        let (d, keep) = decide_two(rule, &mut words, now, cost);
        (d, keep.then(|| Two::made(rule, words)))
    }

    #[inline]
    fn step(&self, rule: &Rule, now: u64, cost: u32) -> (Step, QuotaState) {
        self.step_kind(rule, now, cost)
    }

    #[inline]
    fn decision(_: &Rule, said: (Step, QuotaState), _: u64, cost: u32) -> Decision {
        decision_two(said, cost)
    }

    fn horizon(&self) -> u64 {
        self.horizon.load(Ordering::Acquire)
    }

    fn refund(&self, rule: &Rule, now: u64, taken: &Reservation, units: u32) {
        self.update(
            |w| rule.idle_at_two(w),
            |w| ((), Some(rule.refund_two(w, now, taken, units))),
        );
    }

    fn charge(&self, rule: &Rule, now: u64, cost: u32) {
        self.update(
            |w| rule.idle_at_two(w),
            |w| ((), Some(rule.charge(w, now, cost))),
        );
    }

    fn charged_absent(rule: &Rule, now: u64, cost: u32) -> Self {
        Two::made(rule, rule.charge([0; 2], now, cost))
    }

    fn full(rule: &Rule, retry_after: u64) -> Decision {
        Decision::store_full(std::slice::from_ref(rule), retry_after)
    }
}

impl crate::keyed::Entry for Two {
    #[inline]
    fn idle_at(&self) -> u64 {
        self.horizon()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU32;
    use std::sync::Barrier;

    use super::*;
    use crate::algo::warmup::Curve;

    const S: u64 = 1_000_000_000;

    fn kinds() -> [TwoQuota; 3] {
        [
            TwoQuota::Fixed(Fixed(Window::new(1_000, 60 * S))),
            TwoQuota::Counter(Counter(Window::new(1_000, 60 * S))),
            TwoQuota::Warm(WarmGcra::new(Curve::new(S, 60 * S, 3, 1_000), 1_000 * S)),
        ]
    }

    /// `v` with `quota` as its own kind.
    fn with<V: WithKind>(quota: &TwoQuota, v: V) -> V::Out {
        let (tag, words) = quota.words();
        TwoQuota::with_words(
            tag,
            |i| words[i],
            || true,
            v,
            |_| unreachable!("a quota in two words has a tag"),
        )
    }

    /// Decides on a slot with the quota as its own kind.
    struct Check<'a> {
        slot: &'a Two,
        now: u64,
        cost: u32,
    }

    impl WithKind for Check<'_> {
        type Out = Decision;
        fn with<R: TwoKind>(self, rule: &R) -> Decision {
            decision_two(self.slot.step_kind(rule, self.now, self.cost), self.cost)
        }
    }

    /// A quota of each kind, with small numbers (nanoseconds), what had left the windows
    /// of quotas it replaced (`gone`, `gone_cur`), and the words of a key.
    fn kind_and_words() -> impl proptest::strategy::Strategy<Value = (TwoQuota, Words)> {
        use proptest::prelude::*;
        let window =
            (1u64..6, 1u64..9, 0u64..14, 0u64..14).prop_map(|(limit, width, a, b)| Window {
                gone: a.max(b),
                gone_cur: a.min(b),
                ..Window::new(limit, width)
            });
        let fixed = (window.clone(), 0u64..20, 0u64..7)
            .prop_map(|(w, end, used)| (TwoQuota::Fixed(Fixed(w)), [end, used]));
        // A counter's window may also have opened at the clock's last instants, where its
        // end is past the clock's range.
        let start = prop_oneof![9 => 0u64..16, 1 => (0u64..16).prop_map(|t| u64::MAX - t)];
        let counter = (window, start, 0u64..7, 0u64..7).prop_map(|(w, start, prev, cur)| {
            (TwoQuota::Counter(Counter(w)), [start, (prev << 32) | cur])
        });
        let warm = (1u64..4, 1u64..6, 1u32..5, 0u64..40 * S, 0u64..4_000_000).prop_map(
            |(burst, period, factor, tat, deficit)| {
                let g = WarmGcra::new(Curve::new(S, period * S, factor, 1_000), burst * S);
                (TwoQuota::Warm(g), [tat, deficit])
            },
        );
        prop_oneof![fixed, counter, warm]
    }

    /// What `quota`, as its own kind, judges of a request of `cost` at `now` on `words`,
    /// the words it keeps and their idle time: through [`TwoKind::judge_kept`], which a
    /// check takes, and through [`TwoKind::judge`] and [`TwoKind::idle_at`], which must say
    /// the same.
    struct Judge {
        words: Words,
        now: u64,
        cost: u32,
    }

    impl WithKind for Judge {
        type Out = (Step, QuotaState, Option<Words>, u64);
        fn with<R: TwoKind>(self, rule: &R) -> Self::Out {
            let ((step, state), kept_words, idle) =
                rule.judge_kept(self.words, self.now, self.cost);
            let (step_j, state_j) = rule.judge(self.words, self.now, self.cost);
            let after = kept(&step_j, self.cost);
            assert_eq!(
                (step, state, kept_words, idle),
                (
                    step_j,
                    state_j,
                    after,
                    rule.idle_at(after.unwrap_or(self.words))
                ),
            );
            (step, state, kept_words, idle)
        }
    }

    proptest::proptest! {
        // A pure function of small numbers: many cases, to reach the corners of what is gone.
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(20_000))]

        /// Each kind decided as its own kind (its step, the figures after it, shared where
        /// the kind shares its work, and the idle time of the words kept) is the general
        /// decision of the quota as a `Rule`: its step, then its state and idle time of the
        /// words kept, over any words, times and costs, after changes that left requests
        /// gone.
        #[test]
        fn each_kind_decides_as_the_general_rule(
            (quota, words) in kind_and_words(),
            now in 0u64..24,
            cost in 0u32..8,
            at_the_end in proptest::bool::weighted(0.05),
        ) {
            // The warm-up's words are in nanoseconds of whole seconds, its times too; a
            // window is also judged at the clock's last instants, where none can open.
            let now = match quota {
                TwoQuota::Warm(_) => now * S * 2,
                _ if at_the_end => u64::MAX - now % 3,
                _ => now,
            };
            let rule = quota.rule();
            let step = Rule::step(&rule, words, &Log::EMPTY, now, cost);
            let kept_words = kept(&step, cost);
            let after = kept_words.unwrap_or(words);
            let general = (
                step,
                Rule::state(&rule, after, &Log::EMPTY, now),
                kept_words,
                rule.idle_at_two(after),
            );
            proptest::prop_assert_eq!(with(&quota, Judge { words, now, cost }), general);
        }
    }

    /// Threads racing on one key, while time stands still, keep the account of every
    /// change: the words are those of one request after another, as many as were admitted
    /// and not given back, never more than the quota admits, with refunds among the checks of
    /// a window (a warm-up keeps the deficit a refunded request brought, so its end state
    /// depends on the order), for every kind, through its own path and the general one.
    #[test]
    fn threads_racing_on_one_key_keep_every_change() {
        for quota in kinds() {
            let rule = quota.rule();
            let now = S;
            // One request after another: how many are admitted.
            let (mut model, mut full) = ([0; 2], 0);
            while decide_two(&rule, &mut model, now, 1).0.is_allowed() {
                full += 1;
            }
            let refunds = !matches!(quota, TwoQuota::Warm(_));
            for general in [false, true] {
                let slot = Two::idle();
                let admitted = AtomicU32::new(0);
                let refunded = AtomicU32::new(0);
                let start = Barrier::new(4);
                std::thread::scope(|s| {
                    for _ in 0..4 {
                        let (slot, admitted, refunded, start) =
                            (&slot, &admitted, &refunded, &start);
                        s.spawn(move || {
                            let mut taken = Vec::new();
                            start.wait();
                            for i in 0..100_000u32 {
                                let d = if general {
                                    slot.decide(&rule, now, 1)
                                } else {
                                    with(&quota, Check { slot, now, cost: 1 })
                                };
                                if d.is_allowed() {
                                    admitted.fetch_add(1, Ordering::Relaxed);
                                    taken.push(Reservation::of(&d, 1));
                                }
                                if refunds && i % 2 == 0 {
                                    if let Some(t) = taken.pop() {
                                        slot.refund(&rule, now, &t, 1);
                                        refunded.fetch_add(1, Ordering::Relaxed);
                                    }
                                }
                            }
                        });
                    }
                });
                let held = admitted.into_inner() - refunded.into_inner();
                assert!(held <= full, "{quota:?}, general {general}");
                let mut model = [0; 2];
                for _ in 0..held {
                    assert!(decide_two(&rule, &mut model, now, 1).0.is_allowed());
                }
                let words = slot.update(|w| rule.idle_at_two(w), |w| (w, None)).0;
                assert_eq!(words, model, "{quota:?}, general {general}");
                assert_eq!(slot.horizon(), rule.idle_at_two(words), "{quota:?}");
            }
        }
    }
}
