//! The quota kinds, each a pure step function over a key's state: no clock, no storage, no I/O.
//!
//! Every kind keeps two words per key and quota ([`Words`]; GCRA uses the first only), except
//! the sliding log, whose state is the [`Log`] of the key's admitted requests (one entry per
//! request, carrying its cost), one shared by all the log quotas of a policy (a request admitted by the policy is admitted by every quota, so
//! they all see the same admissions). A state of all zeros and an empty log is the state of a
//! key never seen, and every kind reaches a state equal to it once idle (see
//! [`Rule::idle_at`]): evicting an idle entry changes no decision.
//!
//! A kind is one variant of [`Rule`] with:
//! * `step(words, log, now, cost)` → [`Step`]: allow (with the words to store and where the
//!   cost lands, its spot in a [`Reservation`]), deny (with the exact time until the same
//!   request would pass), or never;
//! * `state(words, log, now)` → [`QuotaState`]: the figures of the `RateLimit` header field;
//! * `idle_at(words, log)`: when the key's state becomes equal to "never seen";
//! * `refund(words, now, spot, cost, units)`: the words once `units` of a request of `cost`
//!   admitted earlier, whose cost landed at `spot`, are given back: only what still counts at
//!   `now` (the log gives back the request's own entry, once for all its quotas, in
//!   [`Log::give_back`]).
//!
//! [`decide`] runs them all or nothing over a policy.

pub(crate) mod gcra;
mod log;
mod step;
mod two;
pub(crate) mod warmup;
mod window;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::decision::{Decision, Outcome, QuotaState, Reservation, MAX_QUOTAS};
use warmup::WarmGcra;

use gcra::{moved_back, slice_back};
pub(crate) use gcra::{Gcra, Many, One};
pub(crate) use log::Log;
#[cfg(test)]
pub(crate) use step::all_or_nothing;
pub(crate) use step::{Slot, Step, Verdict, Words};
#[cfg(test)]
pub(crate) use two::AsRule;
pub(crate) use two::{decision_two, Two, TwoKind, TwoQuota, WithKind, QUOTA_WORDS};
use two::{warm, Counter, Fixed};
pub(crate) use window::Window;

/// [`Rule::step`] of a log quota: out of line, so that the other kinds' steps, which the
/// decisions of one quota in two words inline, keep their size (a policy with a log quota
/// steps its log in [`decide_into`], inlined there).
#[inline(never)]
fn log_step(w: &Window, log: &Log, now: u64, cost: u32) -> Step {
    w.log_step(log, now, cost).0
}

/// One quota, reduced to the numbers its kind needs, in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rule {
    Gcra(Gcra),
    FixedWindow(Window),
    SlidingLog(Window),
    SlidingWindow(Window),
    /// GCRA with warm-up: words `[tat, deficit]` (see [`warmup`]).
    WarmUp(WarmGcra),
}

impl Rule {
    /// The most one request may cost (the burst, or the window's count).
    pub(crate) fn limit(&self) -> u64 {
        match self {
            Rule::Gcra(g) => g.burst(),
            Rule::FixedWindow(w) | Rule::SlidingLog(w) | Rule::SlidingWindow(w) => w.limit,
            Rule::WarmUp(g) => g.burst(),
        }
    }

    /// How long after a key's last change its state may still differ from one never seen,
    /// beyond what its stored times say: the reach of a window that is judged by the width in
    /// force (sliding kinds), or of a warm-up's cooling. Zero for kinds whose stored state
    /// carries its own end (GCRA, fixed window).
    pub(crate) fn reach(&self) -> u64 {
        match self {
            Rule::Gcra(_) | Rule::FixedWindow(_) => 0,
            Rule::SlidingLog(w) => w.width,
            Rule::SlidingWindow(w) => w.width.saturating_mul(2),
            Rule::WarmUp(g) => g.curve.period.saturating_mul(g.curve.unit),
        }
    }

    /// The rules `new` in place of `old` (of the same kinds, position by position) from
    /// `now` on: what had left a window of `old` stays gone (see [`Window::replacing`]).
    pub(crate) fn replacing(new: &mut [Rule], old: &[Rule], now: u64) {
        for (n, o) in new.iter_mut().zip(old) {
            match (n, o) {
                (Rule::SlidingLog(n), Rule::SlidingLog(o))
                | (Rule::SlidingWindow(n), Rule::SlidingWindow(o)) => *n = n.replacing(o, now),
                _ => {}
            }
        }
    }

    /// Whether a key's whole state under this quota alone is its two words: every kind but
    /// the sliding log, whose state is its log.
    #[inline]
    pub(crate) fn in_two_words(&self) -> bool {
        !matches!(self, Rule::SlidingLog(_))
    }

    /// When a key whose state under this quota alone is `words` becomes equal to one never
    /// seen (see [`in_two_words`](Self::in_two_words)).
    #[inline]
    pub(crate) fn idle_at_two(&self, words: Words) -> u64 {
        self.idle_at(words, &Log::EMPTY)
    }

    /// [`refund`](Self::refund) of what the request that took `taken` took from this quota,
    /// the only one of its policy: `units` of it, at most its cost.
    pub(crate) fn refund_two(
        &self,
        words: Words,
        now: u64,
        taken: &Reservation,
        units: u32,
    ) -> Words {
        let units = units.min(taken.cost);
        if units == 0 {
            return words;
        }
        self.refund(words, now, taken.spots[0], taken.cost, units)
    }

    /// The GCRA parameters, for a GCRA quota.
    pub(crate) fn as_gcra(&self) -> Option<&Gcra> {
        match self {
            Rule::Gcra(g) => Some(g),
            _ => None,
        }
    }

    /// The window of a sliding-log quota.
    fn log_width(&self) -> Option<u64> {
        match self {
            Rule::SlidingLog(w) => Some(w.width),
            _ => None,
        }
    }

    /// Decides a request of `cost` at `now`.
    #[inline]
    pub(crate) fn step(&self, words: Words, log: &Log, now: u64, cost: u32) -> Step {
        match self {
            Rule::Gcra(g) => g.step(words[0], now, cost),
            Rule::FixedWindow(w) => w.fixed_step(words, now, cost),
            Rule::SlidingLog(w) => log_step(w, log, now, cost),
            Rule::SlidingWindow(w) => w.counter_step(words, now, cost),
            Rule::WarmUp(g) => g.step(warm(words), now, cost),
        }
    }

    /// The figures of the quota for a key in this state at `now`.
    #[inline]
    pub(crate) fn state(&self, words: Words, log: &Log, now: u64) -> QuotaState {
        match self {
            Rule::Gcra(g) => QuotaState::of(g, words[0], now),
            Rule::FixedWindow(w) => w.fixed_state(words, now),
            Rule::SlidingLog(w) => w.log_state(log, now),
            Rule::SlidingWindow(w) => w.counter_state(words, now),
            Rule::WarmUp(g) => g.state(warm(words), now),
        }
    }

    /// The figures of a quota that nothing is known of: nothing remaining, and the whole
    /// period until it is back.
    pub(crate) fn spent(&self) -> QuotaState {
        match self {
            Rule::Gcra(g) => QuotaState::spent(g),
            Rule::FixedWindow(w) | Rule::SlidingLog(w) => QuotaState::counted(w.limit, 0, w.width),
            Rule::SlidingWindow(w) => QuotaState::counted(w.limit, 0, w.width.saturating_mul(2)),
            Rule::WarmUp(g) => QuotaState::counted(g.burst(), 0, g.tolerance),
        }
    }

    /// When this quota's state becomes equal to "never seen", if nothing else happens.
    #[inline]
    pub(crate) fn idle_at(&self, words: Words, log: &Log) -> u64 {
        match self {
            Rule::Gcra(_) => words[0],
            Rule::FixedWindow(w) => w.fixed_idle_at(words),
            Rule::SlidingLog(w) => w.log_idle_at(log),
            Rule::SlidingWindow(w) => w.counter_idle_at(words),
            Rule::WarmUp(g) => g.idle_at(warm(words)),
        }
    }

    /// The words once `cost` is taken at `now` whatever the limit (a cost settled after the
    /// response): GCRA goes into debt, a window counts beyond its limit (the log's entries
    /// are added by [`KeyState::charge`]).
    pub(crate) fn charge(&self, words: Words, now: u64, cost: u32) -> Words {
        match self {
            Rule::Gcra(g) => [g.charged(words[0], now, cost), 0],
            Rule::FixedWindow(w) => w.fixed_charge(words, now, cost),
            Rule::SlidingLog(_) => words,
            Rule::SlidingWindow(w) => w.counter_charge(words, now, cost),
            Rule::WarmUp(g) => {
                let s = g.charged(warm(words), now, cost);
                [s.tat, s.deficit]
            }
        }
    }

    /// The words once `units` of a request of `cost`, whose cost landed at `spot`, are given
    /// back at `now`: only the part that still counts (nothing once its window has passed;
    /// for GCRA, the end part of its own slice still ahead of now, never moving the time
    /// before now).
    pub(crate) fn refund(
        &self,
        words: Words,
        now: u64,
        spot: Words,
        cost: u32,
        units: u32,
    ) -> Words {
        match self {
            Rule::Gcra(_) => [
                moved_back(words[0], slice_back(spot, cost, units, now, 1), now),
                0,
            ],
            Rule::FixedWindow(w) => w.fixed_refund(words, now, spot, units),
            Rule::SlidingLog(_) => words,
            Rule::SlidingWindow(w) => w.counter_refund(words, now, spot, units),
            // The warm-up the request brought is kept: the deficit stays.
            Rule::WarmUp(g) => {
                let back = slice_back(spot, cost, units, now, g.curve.unit);
                [moved_back(words[0], back, now), words[1]]
            }
        }
    }
}

/// The state of one key under a policy of any kinds.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct KeyState {
    pub(crate) words: [Words; MAX_QUOTAS],
    pub(crate) log: Log,
}

impl KeyState {
    /// When the key becomes equal to one never seen.
    #[inline]
    pub(crate) fn idle_at(&self, rules: &[Rule]) -> u64 {
        match rules {
            [Rule::SlidingLog(w)] => w.log_idle_at(&self.log),
            _ => self.idle_at_many(rules),
        }
    }

    /// [`idle_at`](Self::idle_at) of a policy of any quotas.
    #[inline(never)]
    fn idle_at_many(&self, rules: &[Rule]) -> u64 {
        let mut at = 0;
        for (i, r) in rules.iter().enumerate().take(MAX_QUOTAS) {
            at = at.max(r.idle_at(self.words[i], &self.log));
        }
        at
    }

    /// Takes `cost` whatever the limit, in every quota (a debt settled after a response,
    /// which stands). The log records it whole, as one entry: a limit raised live later
    /// still counts all of it, and a key's log holds at most one entry per admitted request
    /// and one per settlement, whatever the costs.
    pub(crate) fn charge(&mut self, rules: &[Rule], now: u64, cost: u32) {
        for (r, w) in rules.iter().zip(self.words.iter_mut()) {
            *w = r.charge(*w, now, cost);
        }
        if let Some((width, limit)) = log_bounds(rules) {
            self.log.room_for(u64::from(cost));
            self.log.admit(now, u64::from(cost), width, limit);
        }
    }

    /// Gives back `units` of the request that took `taken`, in every quota: only what still
    /// counts at `now` (see [`Rule::refund`] and [`Log::give_back`]).
    pub(crate) fn refund(&mut self, rules: &[Rule], now: u64, taken: &Reservation, units: u32) {
        let units = units.min(taken.cost);
        if units == 0 {
            return;
        }
        let mut log = None;
        for (i, (r, w)) in rules.iter().zip(self.words.iter_mut()).enumerate() {
            *w = r.refund(*w, now, taken.spots[i], taken.cost, units);
            if r.log_width().is_some() {
                log = Some(taken.spots[i][0]);
            }
        }
        if let Some(time) = log {
            self.log.give_back(time, u64::from(units));
        }
    }
}

impl Decision {
    /// A decision made by a store's failure policy: admitted (fail open) or limited for
    /// `retry_after` nanoseconds (fail closed), with no knowledge of the key's state.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn degraded(rules: &[Rule], allowed: bool, retry_after: u64) -> Decision {
        let outcome = if allowed {
            Outcome::Allowed
        } else {
            Outcome::Limited
        };
        let retry_after = if allowed { 0 } else { retry_after };
        Decision::spent(rules, outcome, retry_after).made_degraded()
    }

    /// A new key turned away because the store tracks as many keys as it may and all of them
    /// are active: limited for `retry_after` nanoseconds (until the first tracked key goes
    /// idle, when a new key is admitted), every quota reported spent.
    pub(crate) fn store_full(rules: &[Rule], retry_after: u64) -> Decision {
        Decision::spent(rules, Outcome::Limited, retry_after).made_full()
    }

    /// Every quota reported spent, as when nothing is known of the key's state.
    fn spent(rules: &[Rule], outcome: Outcome, retry_after: u64) -> Decision {
        let mut quotas = [QuotaState::default(); MAX_QUOTAS];
        for (q, r) in quotas.iter_mut().zip(rules) {
            *q = r.spent();
        }
        Decision::new(
            outcome,
            retry_after,
            quotas,
            rules.len(),
            Reservation::none(),
        )
    }

    /// The decision for a request of a key banned for `left` more nanoseconds, on quotas
    /// `rules`: nothing remaining on any quota, and no quota back before the ban ends.
    pub(crate) fn banned(rules: &[Rule], left: u64) -> Decision {
        let mut quotas = [QuotaState::default(); MAX_QUOTAS];
        for (q, r) in quotas.iter_mut().zip(rules) {
            *q = match r {
                Rule::Gcra(g) => QuotaState::ahead_by(g, left.max(g.tolerance)),
                _ => {
                    let reset = r.spent().reset_after_nanos().max(left);
                    QuotaState::counted(r.limit(), 0, reset)
                }
            };
        }
        Decision::new(
            Outcome::Banned,
            left,
            quotas,
            rules.len(),
            Reservation::none(),
        )
    }
}

/// How much later than its stored idle time a key stored under `old` may become idle under
/// `new`, replacing them at `now`, and until when that can matter: `(lag, until)`. Only the
/// kinds judged by the rules in force can move (a sliding window widened, a warm-up curve
/// changed); a key stored before `now` under a sliding window is idle under the new one by
/// `now` plus its reach. A change of curve measures every kept key's idle time again under
/// the new curve (the memory store's `replacing`), so its lag only covers a request decided
/// under the old curve while the change is made.
pub(crate) fn widening(old: &[Rule], new: &[Rule], now: u64) -> (u64, u64) {
    let (mut lag, mut until) = (0, 0);
    for (o, n) in old.iter().zip(new) {
        let more = match (o, n) {
            (Rule::WarmUp(a), Rule::WarmUp(b)) if a.curve != b.curve => n.reach(),
            _ => n.reach().saturating_sub(o.reach()),
        };
        if more > 0 {
            lag = lag.max(more);
            until = until.max(now.saturating_add(n.reach()));
        }
    }
    (lag, until)
}

/// The widest window and the largest limit among the sliding-log quotas of `rules`, if any:
/// how long the shared log keeps its entries, and how many it may need room for.
fn log_bounds(rules: &[Rule]) -> Option<(u64, u64)> {
    let mut bounds: Option<(u64, u64)> = None;
    for r in rules {
        if let Rule::SlidingLog(w) = r {
            let (width, limit) = bounds.unwrap_or((0, 0));
            bounds = Some((width.max(w.width), limit.max(w.limit)));
        }
    }
    bounds
}

/// Decides a request of `cost` against every quota of `rules` at once, all or nothing, and
/// updates `state` when it is admitted. Returns the decision (with what an admission took,
/// see [`Reservation`]) and whether `state` changed.
pub(crate) fn decide(
    rules: &[Rule],
    state: &mut KeyState,
    now: u64,
    cost: u32,
) -> (Decision, bool) {
    let mut d = Decision::unlimited();
    let (changed, _) = decide_into(rules, state, now, cost, &mut d);
    (d, changed)
}

/// [`decide`], writing the decision into `d` (where its caller keeps it, so that the many
/// words of a decision made under a key's lock are not copied out through the lock's
/// closure). Returns whether `state` changed, and when the key becomes idle after it (see
/// [`KeyState::idle_at`]).
#[inline]
fn decide_into(
    rules: &[Rule],
    state: &mut KeyState,
    now: u64,
    cost: u32,
    d: &mut Decision,
) -> (bool, u64) {
    match rules {
        [Rule::SlidingLog(w)] => decide_log(w, &mut state.log, now, cost, d),
        _ => decide_many(rules, state, now, cost, d),
    }
}

/// [`decide_into`] for any policy: every quota asked, all or nothing, in one pass. Each
/// quota is judged by its own kind's code, as a policy of that quota alone judges it (one
/// match on the kind: its step, its figures after it, the words it keeps and their idle
/// time, from one reading of its words; see [`TwoKind::judge_kept`]), and its figures and
/// spot are written where the decision is kept; the words it keeps are written in the key's
/// state as it goes, and put back if a later quota refuses. A log quota is stepped on the
/// shared log, which records the request once every quota has admitted it; its figures are
/// read after. Only on a refusal are the figures and idle times of the quotas that would
/// have admitted found again, of the words that stay.
#[inline]
pub(super) fn decide_many(
    rules: &[Rule],
    state: &mut KeyState,
    now: u64,
    cost: u32,
    d: &mut Decision,
) -> (bool, u64) {
    let n = rules.len().min(MAX_QUOTAS);
    let rules = &rules[..n];
    let mut p = Pass::new();
    let (quotas, spots) = d.parts_mut();
    for i in 0..n {
        let words = &mut state.words[i];
        let (figures, spot) = (&mut quotas[i], &mut spots[i]);
        match &rules[i] {
            Rule::Gcra(g) => p.judge(g, i, words, now, cost, figures, spot),
            Rule::FixedWindow(w) => p.judge(&Fixed(*w), i, words, now, cost, figures, spot),
            Rule::SlidingWindow(w) => p.judge(&Counter(*w), i, words, now, cost, figures, spot),
            Rule::WarmUp(g) => p.judge_warm(g, i, words, now, cost, figures, spot),
            Rule::SlidingLog(w) => {
                let (step, below) = w.log_step(&state.log, now, cost);
                p.below[i] = below;
                p.logs |= 1 << i;
                p.bounds = (p.bounds.0.max(w.width), p.bounds.1.max(w.limit));
                p.step(step, spot);
            }
        }
    }
    for q in &mut quotas[n..] {
        *q = QuotaState::default();
    }
    let allowed = p.outcome == Outcome::Allowed && cost > 0;
    let mut idle = p.idle_stay;
    if allowed {
        idle = idle.max(p.idle_took);
        for s in &mut spots[n..] {
            *s = [0; 2];
        }
    } else {
        // Refused: the words stay, and so do the figures and the idle time they give.
        let mut m = p.took;
        while m != 0 {
            let i = m.trailing_zeros() as usize;
            m &= m - 1;
            state.words[i] = p.was[i];
            quotas[i] = rules[i].state(p.was[i], &Log::EMPTY, now);
            idle = idle.max(rules[i].idle_at_two(p.was[i]));
        }
    }
    let mut m = p.logs;
    if m != 0 {
        // Admitted at a cost, the log records the request once for all its quotas; then
        // every log quota's figures and idle time read the log's newest entry, once.
        let newest = if allowed {
            state
                .log
                .admit(now, u64::from(cost), p.bounds.0, p.bounds.1)
        } else {
            state.log.newest_entry()
        };
        let time = newest.map(|(t, _)| t);
        while m != 0 {
            let i = m.trailing_zeros() as usize;
            m &= m - 1;
            if let Rule::SlidingLog(w) = &rules[i] {
                let held = Log::held_after(newest, p.below[i], now, w.width, w.gone);
                quotas[i] = w.log_figures(held, time.unwrap_or(0), now);
                idle = idle.max(w.log_idle_after(time));
            }
        }
    }
    // Only a limited request waits: one that can never pass carries no wait.
    let wait = if p.outcome == Outcome::Limited {
        p.wait
    } else {
        0
    };
    d.conclude(p.outcome, wait, n, cost);
    (allowed, idle)
}

/// What [`decide_many`]'s pass over the quotas has found so far.
struct Pass {
    /// Allowed while every quota allowed; limited once one denied and none said never;
    /// exceeds once one said never.
    outcome: Outcome,
    /// The longest wait among the quotas that denied.
    wait: u64,
    /// The quotas whose words the request changes (bit `i` for the `i`-th), and their words
    /// as they were.
    took: u8,
    was: [Words; MAX_QUOTAS],
    /// When the key becomes idle under the quotas whose words stay, and under those whose
    /// words the request changes, with the words it leaves.
    idle_stay: u64,
    idle_took: u64,
    /// The log quotas, the log's running total before each one's window (a log quota's
    /// figures are read from it after the request, without a second search: see
    /// `Log::held_after`), and the widest log window (how long the log keeps its entries)
    /// and the largest log limit (the room it may need).
    logs: u8,
    below: [u64; MAX_QUOTAS],
    bounds: (u64, u64),
}

impl Pass {
    /// Before any quota is asked.
    #[inline(always)]
    fn new() -> Self {
        Pass {
            outcome: Outcome::Allowed,
            wait: 0,
            took: 0,
            was: [[0; 2]; MAX_QUOTAS],
            idle_stay: 0,
            idle_took: 0,
            logs: 0,
            below: [0; MAX_QUOTAS],
            bounds: (0, 0),
        }
    }

    /// Judges the `i`-th quota, `rule`, of its own kind, on its `words`: writes its figures
    /// after the step and where its cost lands, and the words it keeps.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn judge(
        &mut self,
        rule: &impl TwoKind,
        i: usize,
        words: &mut Words,
        now: u64,
        cost: u32,
        figures: &mut QuotaState,
        spot: &mut Words,
    ) {
        let ((step, state), kept, idle) = rule.judge_kept(*words, now, cost);
        self.step(step, spot);
        *figures = state;
        match kept {
            Some(after) => {
                self.was[i] = *words;
                *words = after;
                self.took |= 1 << i;
                self.idle_took = self.idle_took.max(idle);
            }
            None => self.idle_stay = self.idle_stay.max(idle),
        }
    }

    /// [`judge`](Self::judge) of a warm-up quota, kept out of line: inlined in the pass, the
    /// curve's arithmetic costs the arms of the other kinds their registers.
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    fn judge_warm(
        &mut self,
        rule: &WarmGcra,
        i: usize,
        words: &mut Words,
        now: u64,
        cost: u32,
        figures: &mut QuotaState,
        spot: &mut Words,
    ) {
        self.judge(rule, i, words, now, cost, figures, spot);
    }

    /// Counts one quota's step, whose cost lands at `spot` when admitted.
    #[inline(always)]
    fn step(&mut self, step: Step, spot: &mut Words) {
        match step {
            Step::Allow { spot: at, .. } => *spot = at,
            Step::Deny { retry_after } => {
                if self.outcome == Outcome::Allowed {
                    self.outcome = Outcome::Limited;
                }
                self.wait = self.wait.max(retry_after);
            }
            Step::Never => self.outcome = Outcome::Exceeds,
        }
    }
}

/// [`decide_into`] for a policy of one sliding-log quota: its step, the request's record and
/// the quota's figures, without the loops over quotas nor the words of other kinds (the same
/// decision as [`decide_many`]'s).
/// Returns whether the log changed, and when the key becomes idle after it.
#[inline]
pub(super) fn decide_log(
    w: &Window,
    log: &mut Log,
    now: u64,
    cost: u32,
    d: &mut Decision,
) -> (bool, u64) {
    let (step, below) = w.log_step(log, now, cost);
    let (outcome, retry_after, taken) = step.alone(cost);
    // The figures and the idle time read the newest entry after the request, once.
    let newest = if taken.cost > 0 {
        log.admit(now, u64::from(cost), w.width, w.limit)
    } else {
        log.newest_entry()
    };
    let held = Log::held_after(newest, below, now, w.width, w.gone);
    let time = newest.map(|(t, _)| t);
    let mut quotas = [QuotaState::default(); MAX_QUOTAS];
    quotas[0] = w.log_figures(held, time.unwrap_or(0), now);
    *d = Decision::new(outcome, retry_after, quotas, 1, taken);
    (taken.cost > 0, w.log_idle_after(time))
}

/// The decision of verdict `v` on a request of `cost`, with the states of the `n` quotas
/// after it: what an admission took, and a wait only when limited.
#[inline]
pub(super) fn concluded(
    v: &Verdict,
    cost: u32,
    quotas: [QuotaState; MAX_QUOTAS],
    n: usize,
) -> Decision {
    let mut taken = Reservation::none();
    if v.outcome == Outcome::Allowed && cost > 0 {
        taken.cost = cost;
        taken.spots = v.spots;
    }
    let retry_after = if v.outcome == Outcome::Limited {
        v.retry_after
    } else {
        0
    };
    Decision::new(v.outcome, retry_after, quotas, n, taken)
}

/// Quotas of any other policy (see [`crate::algo`]): two words per quota and the log of
/// admitted requests when a quota is a sliding log, changed together under the key's own
/// lock. Boxed, so that a table's entries stay small.
pub(crate) struct Mixed(Box<Kept<KeyState>>);

/// A key's state under its lock, and when it becomes idle.
struct Kept<S> {
    state: Mutex<S>,
    horizon: AtomicU64,
}

impl<S> Kept<S> {
    fn new(state: S, horizon: u64) -> Self {
        Kept {
            state: Mutex::new(state),
            horizon: AtomicU64::new(horizon),
        }
    }

    /// Reads the key's state and replaces it through `f`, under the key's lock, then keeps
    /// the time the key becomes idle (`idle_at`) beside it.
    #[inline]
    fn measure_and_replace<T>(
        &self,
        f: impl FnOnce(&mut S) -> T,
        idle_at: impl FnOnce(&S) -> u64,
    ) -> T {
        self.replace(|state| {
            let said = f(state);
            (said, idle_at(state))
        })
    }

    /// Reads the key's state and replaces it through `f`, under the key's lock, then keeps
    /// the time the key becomes idle, which `f` says with what it says, beside it.
    #[inline]
    fn replace<T>(&self, f: impl FnOnce(&mut S) -> (T, u64)) -> T {
        // A poisoned lock only means another thread panicked while deciding; the state is
        // still a valid state: every quota's words are valid words, though a policy of
        // several quotas writes each one's as it goes (`decide_many`), so a panic half way
        // would leave the request taken from the quotas before it.
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let (said, horizon) = f(&mut state);
        self.horizon.store(horizon, Ordering::Release);
        said
    }

    /// When the key becomes idle.
    #[inline]
    fn horizon(&self) -> u64 {
        self.horizon.load(Ordering::Acquire)
    }

    /// Makes the key one never seen if `idle` says its state is idle, under the key's lock;
    /// whether it did.
    fn renew_if(&self, idle: impl FnOnce(&S) -> bool) -> bool
    where
        S: Default,
    {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let renew = idle(&state);
        if renew {
            *state = S::default();
            self.horizon.store(0, Ordering::Release);
        }
        renew
    }
}

impl Mixed {
    pub(crate) fn idle() -> Self {
        Mixed(Box::new(Kept::new(KeyState::default(), 0)))
    }

    /// The slot of a key in `state` under `rules`.
    fn made(rules: &[Rule], state: KeyState) -> Self {
        let horizon = state.idle_at(rules);
        Mixed(Box::new(Kept::new(state, horizon)))
    }

    /// Changes the key's state through `f`, under its lock.
    #[inline]
    fn change<T>(&self, rules: &[Rule], f: impl FnOnce(&mut KeyState) -> T) -> T {
        self.0.measure_and_replace(f, |s| s.idle_at(rules))
    }

    /// Makes the key one never seen if it is idle at `now` under every quota of `rules`
    /// (see [`Two::renew_if_idle`]); whether it did.
    pub(crate) fn renew_if_idle(&self, rules: &[Rule], now: u64) -> bool {
        self.0.renew_if(|s| s.idle_at(rules) <= now)
    }
}

impl Slot for Mixed {
    type Rules = [Rule];
    /// The decision itself: the quotas' states are read from the log, under the lock.
    type Said = Decision;

    fn decide_absent(rules: &[Rule], now: u64, cost: u32) -> (Decision, Option<Self>) {
        let mut state = KeyState::default();
        let (d, keep) = decide(rules, &mut state, now, cost);
        (d, keep.then(|| Mixed::made(rules, state)))
    }

    fn step(&self, rules: &[Rule], now: u64, cost: u32) -> Decision {
        let mut d = Decision::unlimited();
        self.decide_into(rules, now, cost, &mut d);
        d
    }

    const IN_PLACE: bool = true;

    fn decide_into(&self, rules: &[Rule], now: u64, cost: u32, d: &mut Decision) {
        self.0
            .replace(|state| ((), decide_into(rules, state, now, cost, d).1));
    }

    #[inline]
    fn decision(_: &[Rule], said: Decision, _: u64, _: u32) -> Decision {
        said
    }

    fn horizon(&self) -> u64 {
        self.0.horizon()
    }

    fn refund(&self, rules: &[Rule], now: u64, taken: &Reservation, units: u32) {
        self.change(rules, |state| state.refund(rules, now, taken, units))
    }

    fn charge(&self, rules: &[Rule], now: u64, cost: u32) {
        self.change(rules, |state| state.charge(rules, now, cost))
    }

    fn charged_absent(rules: &[Rule], now: u64, cost: u32) -> Self {
        let mut state = KeyState::default();
        state.charge(rules, now, cost);
        Mixed::made(rules, state)
    }

    fn full(rules: &[Rule], retry_after: u64) -> Decision {
        Decision::store_full(rules, retry_after)
    }
}

impl crate::keyed::Entry for Mixed {
    fn idle_at(&self) -> u64 {
        self.horizon()
    }
}

#[cfg(test)]
mod tests;
