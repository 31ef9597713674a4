//! The quota kinds, each a pure step function over a key's state: no clock, no storage, no I/O.
//!
//! Every kind keeps two words per key and quota ([`Words`]; GCRA uses the first only), except
//! the sliding log, whose state is the [`Log`] of the key's admitted requests, one shared by all
//! the log quotas of a policy (a request admitted by the policy is admitted by every quota, so
//! they all see the same admissions). A state of all zeros and an empty log is the state of a
//! key never seen, and every kind reaches a state equal to it once idle (see
//! [`Rule::idle_at`]): evicting an idle entry changes no decision.
//!
//! A kind is one variant of [`Rule`] with:
//! * `step(words, log, now, cost)` → [`Step`]: allow (with the words to store), deny (with the
//!   exact time until the same request would pass), or never;
//! * `state(words, log, now)` → [`QuotaState`]: the figures of the `RateLimit` header field;
//! * `idle_at(words, log)`: when the key's state becomes equal to "never seen";
//! * `refund(words, now, cost)`: the words once `cost` admitted earlier is given back (the log
//!   gives back its newest entries, once for all its quotas, in [`Log::refund`]).
//!
//! [`decide`] runs them all or nothing over a policy.

mod window;

use std::collections::VecDeque;

use crate::gcra::{Decision, Gcra, Outcome, QuotaState, MAX_QUOTAS};
use crate::warmup::{WarmGcra, WarmState, WarmStep};

pub(crate) use window::Window;

/// The state of one quota of one key: two words, zero when never seen.
pub(crate) type Words = [u64; 2];

/// What one quota says about one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Admitted; store these words (a log quota also appends the request to the log).
    Allow(Words),
    /// Not now; admissible after `retry_after` nanoseconds.
    Deny { retry_after: u64 },
    /// The cost is larger than the quota's limit: no amount of waiting helps.
    Never,
}

/// One quota, reduced to the numbers its kind needs, in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rule {
    Gcra(Gcra),
    FixedWindow(Window),
    SlidingLog(Window),
    SlidingWindow(Window),
    /// GCRA with warm-up: words `[tat, deficit]` (see [`crate::warmup`]).
    WarmUp(WarmGcra),
}

fn warm(words: Words) -> WarmState {
    WarmState {
        tat: words[0],
        deficit: words[1],
    }
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

    /// The GCRA parameters, for a GCRA quota.
    /// The rules `new` as the replacement, at `now`, of `old` (same kinds, same positions):
    /// see [`Gcra::replacing`].
    pub(crate) fn replacing(new: &mut [Rule], old: &[Rule], now: u64) {
        for (n, o) in new.iter_mut().zip(old) {
            if let (Rule::Gcra(n), Rule::Gcra(o)) = (n, o) {
                *n = n.replacing(o, now);
            }
        }
    }

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
            Rule::Gcra(g) => match g.step(words[0], now, cost) {
                crate::gcra::Step::Allow { new_tat } => Step::Allow([new_tat, 0]),
                crate::gcra::Step::Deny { retry_after } => Step::Deny { retry_after },
                crate::gcra::Step::Never => Step::Never,
            },
            Rule::FixedWindow(w) => w.fixed_step(words, now, cost),
            Rule::SlidingLog(w) => w.log_step(log, now, cost),
            Rule::SlidingWindow(w) => w.counter_step(words, now, cost),
            Rule::WarmUp(g) => match g.step(warm(words), now, cost) {
                WarmStep::Allow(s) => Step::Allow([s.tat, s.deficit]),
                WarmStep::Deny { retry_after } => Step::Deny { retry_after },
                WarmStep::Never => Step::Never,
            },
        }
    }

    /// The figures of the quota for a key in this state at `now`.
    pub(crate) fn state(&self, words: Words, log: &Log, now: u64) -> QuotaState {
        match self {
            Rule::Gcra(g) => QuotaState::of(g, words[0], now),
            Rule::FixedWindow(w) => w.fixed_state(words, now),
            Rule::SlidingLog(w) => w.log_state(log, now),
            Rule::SlidingWindow(w) => w.counter_state(words, now),
            Rule::WarmUp(g) => {
                let s = warm(words);
                QuotaState::counted(g.burst(), g.remaining(s, now), s.tat.saturating_sub(now))
            }
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
    pub(crate) fn idle_at(&self, words: Words, log: &Log) -> u64 {
        match self {
            Rule::Gcra(_) => words[0],
            Rule::FixedWindow(w) => w.fixed_idle_at(words),
            Rule::SlidingLog(w) => log.newest().map_or(0, |t| t.saturating_add(w.width)),
            Rule::SlidingWindow(w) => w.counter_idle_at(words),
            Rule::WarmUp(g) => g.idle_at(warm(words)),
        }
    }

    /// The words once `cost` is taken at `now` whatever the limit (a cost settled after the
    /// response): GCRA goes into debt, a window counts beyond its limit (the log's entries
    /// are added by [`KeyState::charge`]).
    pub(crate) fn charge(&self, words: Words, now: u64, cost: u32) -> Words {
        match self {
            Rule::Gcra(g) => [crate::store::memory::charged(g, words[0], now, cost), 0],
            Rule::FixedWindow(w) => w.fixed_charge(words, now, cost),
            Rule::SlidingLog(_) => words,
            Rule::SlidingWindow(w) => w.counter_charge(words, now, cost),
            Rule::WarmUp(g) => {
                let s = g.charged(warm(words), now, cost);
                [s.tat, s.deficit]
            }
        }
    }

    /// The words once a request of `cost` admitted earlier is given back at `now`.
    pub(crate) fn refund(&self, words: Words, now: u64, cost: u32) -> Words {
        match self {
            Rule::Gcra(g) => [crate::store::memory::refunded(g, words[0], now, cost), 0],
            Rule::FixedWindow(w) => w.fixed_refund(words, now, cost),
            Rule::SlidingLog(_) => words,
            Rule::SlidingWindow(w) => w.counter_refund(words, now, cost),
            Rule::WarmUp(g) => {
                let s = g.refunded(warm(words), now, cost);
                [s.tat, s.deficit]
            }
        }
    }
}

/// The times of a key's admitted requests, oldest first, one entry per unit of cost; kept as
/// long as the longest sliding-log window of the policy.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Log(VecDeque<u64>);

impl Log {
    /// Entries still inside a window of `width` at `now` (times `t` with `t + width > now`).
    #[inline]
    pub(crate) fn in_window(&self, now: u64, width: u64) -> (usize, usize) {
        let first = self.0.partition_point(|&t| t.saturating_add(width) <= now);
        (first, self.0.len() - first)
    }

    pub(crate) fn get(&self, i: usize) -> Option<u64> {
        self.0.get(i).copied()
    }

    pub(crate) fn newest(&self) -> Option<u64> {
        self.0.back().copied()
    }

    /// Records `cost` units admitted at `now`, after dropping what no window of `width` or
    /// less can see any more. A time earlier than the newest entry (a reading of the clock taken
    /// before another thread's decision) is recorded as the newest: later, never earlier, so the
    /// log stays sorted and never admits more than it should.
    fn admit(&mut self, now: u64, cost: u32, width: u64) {
        self.trim(now, width);
        let at = self.newest().map_or(now, |t| t.max(now));
        self.0.extend(std::iter::repeat(at).take(cost as usize));
    }

    fn trim(&mut self, now: u64, width: u64) {
        let (first, _) = self.in_window(now, width);
        self.0.drain(..first);
        if self.0.is_empty() && self.0.capacity() > 64 {
            self.0 = VecDeque::new();
        }
    }

    /// Gives back `cost` units admitted earlier: the newest entries go.
    fn refund(&mut self, cost: u32) {
        let keep = self.0.len().saturating_sub(cost as usize);
        self.0.truncate(keep);
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
    pub(crate) fn idle_at(&self, rules: &[Rule]) -> u64 {
        let mut at = 0;
        for (r, w) in rules.iter().zip(&self.words) {
            at = at.max(r.idle_at(*w, &self.log));
        }
        at
    }

    /// Takes `cost` whatever the limit, in every quota. The log records at most its largest
    /// limit of entries: more, all at the same time, would change no decision.
    pub(crate) fn charge(&mut self, rules: &[Rule], now: u64, cost: u32) {
        let mut log: Option<(u64, u64)> = None;
        for (r, w) in rules.iter().zip(self.words.iter_mut()) {
            *w = r.charge(*w, now, cost);
            if let Rule::SlidingLog(win) = r {
                let (width, limit) = log.unwrap_or((0, 0));
                log = Some((width.max(win.width), limit.max(win.limit)));
            }
        }
        if let Some((width, limit)) = log {
            let entries = u64::from(cost).min(limit);
            self.log.admit(now, entries as u32, width);
        }
    }

    /// Gives back a request of `cost` admitted earlier, in every quota.
    pub(crate) fn refund(&mut self, rules: &[Rule], now: u64, cost: u32) {
        for (r, w) in rules.iter().zip(self.words.iter_mut()) {
            *w = r.refund(*w, now, cost);
        }
        if rules.iter().any(|r| r.log_width().is_some()) {
            self.log.refund(cost);
        }
    }
}

/// Decides a request of `cost` against every quota of `rules` at once, all or nothing, and
/// updates `state` when it is admitted. Returns the decision and whether `state` changed.
pub(crate) fn decide(
    rules: &[Rule],
    state: &mut KeyState,
    now: u64,
    cost: u32,
) -> (Decision, bool) {
    debug_assert!(rules.len() <= MAX_QUOTAS);
    let mut outcome = Outcome::Allowed;
    let mut retry_after = 0;
    let mut new = [[0u64; 2]; MAX_QUOTAS];
    let mut log_width = None;
    let mut clamped = false;
    for (i, r) in rules.iter().enumerate() {
        if let (Rule::Gcra(g), true) = (r, cost > 0) {
            // Brought back to the tolerance even when rejected: see `Gcra::held`.
            let held = g.held(state.words[i][0], now);
            if held != state.words[i][0] {
                state.words[i][0] = held;
                clamped = true;
            }
        }
        if let Some(w) = r.log_width() {
            log_width = Some(log_width.map_or(w, |m: u64| m.max(w)));
        }
        match r.step(state.words[i], &state.log, now, cost) {
            Step::Allow(w) => new[i] = w,
            Step::Deny { retry_after: r } => {
                if outcome == Outcome::Allowed {
                    outcome = Outcome::Limited;
                }
                retry_after = retry_after.max(r);
            }
            Step::Never => outcome = Outcome::Exceeds,
        }
    }
    let allowed = outcome == Outcome::Allowed && cost > 0;
    if allowed {
        state.words[..rules.len()].copy_from_slice(&new[..rules.len()]);
        if let Some(width) = log_width {
            state.log.admit(now, cost, width);
        }
    }
    let mut quotas = [QuotaState::default(); MAX_QUOTAS];
    for (i, r) in rules.iter().enumerate() {
        quotas[i] = r.state(state.words[i], &state.log, now);
    }
    let retry_after = if outcome == Outcome::Limited {
        retry_after
    } else {
        0
    };
    (
        Decision::from_store(outcome, retry_after, &quotas[..rules.len()]),
        allowed || clamped,
    )
}

#[cfg(test)]
mod tests;
