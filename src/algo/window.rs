//! The window kinds: fixed window, sliding-window log, sliding-window counter.
//!
//! Windows belong to the key: the first admitted request of an idle key opens a window of
//! `width`, and windows follow one another from there for as long as the key stays busy. No
//! kind depends on where the clock's origin lies, so the memory store and Redis (whose clock
//! is the server's) agree to the nanosecond, and keys do not all reset at the same instant.
//!
//! Fixed window, words `[end, used]`: a window keeps the end it opened with, so a new width
//! applies from the key's next window.
//! ```text
//! window  = (end, used) if used > 0 and now < end, else (now + width, 0)
//! allow   = used + c <= limit                       store (end, used + c)
//! retry   = end - now                               (the next window takes any c <= limit)
//! ```
//! A window that would end past the clock's last nanosecond is not opened: the request is
//! refused, as GCRA refuses a time it cannot represent.
//!
//! Sliding-window counter, words `[start, prev << 32 | cur]`: `start` opens the current fixed
//! window, `cur` counts it and `prev` the one before. With `e = now - start` (`0 <= e < width`):
//! ```text
//! allow   = (cur + c) * width + prev * (width - e) <= limit * width    (exact, in u128)
//! ```
//! A request rejected while `cur + c <= limit` passes once `prev`'s weight has fallen enough,
//! at the first `e'` with `prev * (width - e') <= (limit - cur - c) * width`; otherwise in the
//! next window, where `cur` has become `prev`, likewise.
//!
//! Sliding-window log: the [`Log`](super::Log) of requests, each with its time and cost.
//! With `n` the cost of the entries inside `(now - width, now]`:
//! ```text
//! allow   = n + c <= limit
//! retry   = t_k + width - now       t_k: the oldest entry in the window by which the
//!                                   costs counted from the oldest reach n + c - limit
//! ```

use super::log::Log;
use super::step::{Step, Words};
use crate::decision::QuotaState;

/// A window quota: at most `limit` per `width` nanoseconds.
///
/// A quota that replaced others while serving also knows what had left their windows when it
/// came (what is gone stays gone, see [`Window::replacing`]): a sliding log's entries before
/// `gone`; a sliding-window counter's previous count when its current window opened before
/// `gone`, and both counts when it opened before `gone_cur`. Both bounds are exclusive, so 0
/// (a quota never replaced, or replaced within a width of the clock's first instant) marks
/// nothing gone, while a change at `width` marks gone a request made at 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Window {
    pub(crate) limit: u64,
    pub(crate) width: u64,
    pub(crate) gone: u64,
    pub(crate) gone_cur: u64,
}

/// The two counts of the sliding-window counter, in one word.
#[inline]
fn unpack(w: u64) -> (u64, u64) {
    (w >> 32, w & 0xffff_ffff)
}

#[inline]
fn pack(prev: u64, cur: u64) -> u64 {
    (prev << 32) | cur
}

impl Window {
    pub(crate) const fn new(limit: u64, width: u64) -> Self {
        Window {
            limit,
            width,
            gone: 0,
            gone_cur: 0,
        }
    }

    /// This quota in place of `old` (of the same kind) from `now` on: what had left `old`'s
    /// window by `now` stays gone, whatever this window's width. A log entry at or before
    /// `now - width` had (before `now - width + 1`); a counter's previous count had once its
    /// current window opened at or before `now - width`, and its current count once it opened
    /// at or before `now - 2 width`.
    pub(crate) fn replacing(self, old: &Window, now: u64) -> Self {
        // The first time still inside a window of `width` at `now`: what came before is gone.
        let kept = |width: u64| now.checked_sub(width).map_or(0, |t| t.saturating_add(1));
        Window {
            gone: old.gone.max(kept(old.width)),
            gone_cur: old.gone_cur.max(kept(old.width.saturating_mul(2))),
            ..self
        }
    }

    /// The quota's numbers as words, to keep a copy in atomics; [`from_words`](Self::from_words)
    /// gives the quota back.
    #[inline]
    pub(crate) const fn words(&self) -> [u64; 4] {
        [self.limit, self.width, self.gone, self.gone_cur]
    }

    /// The quota whose [`words`](Self::words) are `w`.
    #[inline]
    pub(crate) const fn from_words(w: [u64; 4]) -> Self {
        Window {
            limit: w[0],
            width: w[1],
            gone: w[2],
            gone_cur: w[3],
        }
    }

    /// The end of a window opened at `start`, never past the clock's range.
    #[inline]
    fn end(&self, start: u64) -> u64 {
        start.saturating_add(self.width)
    }

    // ---- fixed window ----

    /// The current window at `now`: its end and what it has used; `None` when a new window
    /// would end past the clock's last nanosecond.
    #[inline]
    fn fixed_current(&self, words: Words, now: u64) -> Option<(u64, u64)> {
        let [end, used] = words;
        if used > 0 && now < end {
            Some((end, used))
        } else {
            now.checked_add(self.width).map(|end| (end, 0))
        }
    }

    #[inline]
    pub(super) fn fixed_step(&self, words: Words, now: u64, cost: u32) -> Step {
        let c = u64::from(cost);
        if c > self.limit {
            return Step::Never;
        }
        let Some((end, used)) = self.fixed_current(words, now) else {
            return Step::Deny {
                retry_after: self.width.max(1),
            };
        };
        if used + c <= self.limit {
            Step::Allow {
                words: [end, used + c],
                spot: [end, 0],
            }
        } else {
            Step::Deny {
                retry_after: end.saturating_sub(now).max(1),
            }
        }
    }

    /// The words once `cost` is taken whatever the limit: counted in the current window (a
    /// window that cannot open any more counts until the clock's end).
    pub(super) fn fixed_charge(&self, words: Words, now: u64, cost: u32) -> Words {
        let (end, used) = self.fixed_current(words, now).unwrap_or((u64::MAX, 0));
        [end, used.saturating_add(u64::from(cost))]
    }

    #[inline]
    pub(super) fn fixed_state(&self, words: Words, now: u64) -> QuotaState {
        let (end, used) = self.fixed_current(words, now).unwrap_or((now, 0));
        let reset = if used > 0 { end.saturating_sub(now) } else { 0 };
        QuotaState::counted(self.limit, self.limit.saturating_sub(used), reset)
    }

    #[inline]
    pub(super) fn fixed_idle_at(&self, words: Words) -> u64 {
        let [end, used] = words;
        if used > 0 {
            end
        } else {
            0
        }
    }

    /// The words once `units` counted in the window ending at `spot[0]` are given back at
    /// `now`: from that window while it is open, not at all once it has passed.
    pub(super) fn fixed_refund(&self, words: Words, now: u64, spot: Words, units: u32) -> Words {
        let [end, used] = words;
        if used == 0 || now >= end || end != spot[0] {
            return words;
        }
        let used = used.saturating_sub(u64::from(units));
        if used == 0 {
            [0, 0]
        } else {
            [end, used]
        }
    }

    // ---- sliding-window counter ----

    /// The current fixed window at `now`: its start, the previous window's count and its own.
    #[inline]
    fn counter_current(&self, words: Words, now: u64) -> (u64, u64, u64) {
        let [start, counts] = words;
        let (mut prev, cur) = unpack(counts);
        if start < self.gone_cur {
            return (now, 0, 0);
        }
        if start < self.gone {
            prev = 0;
        }
        if prev == 0 && cur == 0 {
            return (now, 0, 0);
        }
        let next = self.end(start);
        if now < next {
            (start, prev, cur)
        } else if cur > 0 && now < self.end(next) {
            (next, cur, 0)
        } else {
            (now, 0, 0)
        }
    }

    /// `prev × (width − e)`: the previous window's weight, times `width`.
    #[inline]
    fn weighted(&self, start: u64, prev: u64, now: u64) -> u128 {
        let e = now.saturating_sub(start).min(self.width);
        u128::from(prev) * u128::from(self.width - e)
    }

    #[inline]
    pub(super) fn counter_step(&self, words: Words, now: u64, cost: u32) -> Step {
        let current = self.counter_current(words, now);
        let weighted = self.weighted(current.0, current.1, now);
        self.counter_step_in(current, weighted, now, cost)
    }

    /// The step and the quota's figures after it, from one reading of the current window:
    /// [`counter_step`](Self::counter_step), then [`counter_state`](Self::counter_state) of
    /// the words it leaves.
    #[inline(always)]
    pub(super) fn counter_judge(&self, words: Words, now: u64, cost: u32) -> (Step, QuotaState) {
        let current = self.counter_current(words, now);
        let (start, prev, cur) = current;
        let weighted = self.weighted(start, prev, now);
        let step = self.counter_step_in(current, weighted, now, cost);
        let state = match step {
            // The words kept read back as the same window with `cost` more in it, unless it
            // opened before what is gone, or a window cannot open at `now`.
            Step::Allow { words: after, .. } if cost > 0 => {
                if start >= self.gone_cur
                    && (prev == 0 || start >= self.gone)
                    && now < self.end(start)
                {
                    let counted = (start, prev, cur + u64::from(cost));
                    self.counter_figures(counted, weighted, now)
                } else {
                    self.counter_state(after, now)
                }
            }
            _ => self.counter_figures(current, weighted, now),
        };
        (step, state)
    }

    /// The common case of a check, decided as [`counter_judge`](Self::counter_judge) decides
    /// it with fewer steps: a check at `now` inside the window the words opened, which counts
    /// requests, with no previous window's count that still weighs. Then the test, the
    /// figures and the idle time are a fixed window's: no product, and the window's ends
    /// found once. Gives the step and the figures after it, the words kept (none: the words
    /// stay) and the time the key becomes idle with the words after it; `None` in any other
    /// case.
    #[inline(always)]
    pub(super) fn counter_in_window(
        &self,
        words: Words,
        now: u64,
        cost: u32,
    ) -> Option<((Step, QuotaState), Option<Words>, u64)> {
        let [start, counts] = words;
        let (prev, cur) = unpack(counts);
        // `counter_current`'s first case: opened after anything gone, counting, and open at
        // `now`; its previous count is gone or none.
        let next = start.checked_add(self.width)?;
        if !(start >= self.gone_cur && cur > 0 && (prev == 0 || start < self.gone) && now < next) {
            return None;
        }
        // Counted in this window, the key stays until the next one has passed too.
        let idle = self.end(next);
        let reset = idle.saturating_sub(now);
        let c = u64::from(cost);
        let step = if c > self.limit {
            Step::Never
        } else if cur + c <= self.limit || self.width == 0 {
            let after = [start, cur + c];
            let state = QuotaState::counted(self.limit, self.limit.saturating_sub(cur + c), reset);
            let step = Step::Allow {
                words: after,
                spot: [start, 0],
            };
            return Some(((step, state), (c > 0).then_some(after), idle));
        } else {
            // Only the next window takes it, once enough of this one's weight has fallen.
            let at = next.saturating_add(self.first_fit(cur, self.limit - c));
            Step::Deny {
                retry_after: at.saturating_sub(now).max(1),
            }
        };
        let state = QuotaState::counted(self.limit, self.limit.saturating_sub(cur), reset);
        Some(((step, state), None, idle))
    }

    /// The first elapsed time `e'` of a window at which `count × (width − e') <= room ×
    /// width`, with `count` the weight that must fall and `room` what may stay.
    #[inline]
    fn first_fit(&self, count: u64, room: u64) -> u64 {
        if count == 0 {
            return 0;
        }
        let w = u128::from(self.width);
        let keep = (u128::from(room) * w) / u128::from(count);
        self.width - keep.min(w) as u64
    }

    /// [`counter_step`](Self::counter_step) in the current window `(start, prev, cur)`, whose
    /// previous count weighs `weighted`.
    #[inline]
    fn counter_step_in(
        &self,
        (start, prev, cur): (u64, u64, u64),
        weighted: u128,
        now: u64,
        cost: u32,
    ) -> Step {
        let c = u64::from(cost);
        if c > self.limit {
            return Step::Never;
        }
        let w = u128::from(self.width);
        let limit = u128::from(self.limit);
        // Without a previous window's weight (a key in its first window, or back from a
        // gap) the test is the fixed window's, with no product.
        let fits = if weighted == 0 {
            cur + c <= self.limit || w == 0
        } else {
            u128::from(cur + c) * w + weighted <= limit * w
        };
        if fits {
            return Step::Allow {
                words: [start, pack(prev, cur + c)],
                spot: [start, 0],
            };
        }
        let at = if cur + c <= self.limit {
            start.saturating_add(self.first_fit(prev, self.limit - cur - c))
        } else {
            self.end(start)
                .saturating_add(self.first_fit(cur, self.limit - c))
        };
        Step::Deny {
            retry_after: at.saturating_sub(now).max(1),
        }
    }

    /// The words once `cost` is taken whatever the limit: counted in the current window (up
    /// to what its half of the word holds).
    pub(super) fn counter_charge(&self, words: Words, now: u64, cost: u32) -> Words {
        let (start, prev, cur) = self.counter_current(words, now);
        let cur = cur.saturating_add(u64::from(cost)).min(u64::from(u32::MAX));
        [start, pack(prev, cur)]
    }

    #[inline]
    pub(super) fn counter_state(&self, words: Words, now: u64) -> QuotaState {
        let current = self.counter_current(words, now);
        let weighted = self.weighted(current.0, current.1, now);
        self.counter_figures(current, weighted, now)
    }

    /// [`counter_state`](Self::counter_state) in the current window `(start, prev, cur)`,
    /// whose previous count weighs `weighted`.
    #[inline]
    fn counter_figures(
        &self,
        (start, prev, cur): (u64, u64, u64),
        weighted: u128,
        now: u64,
    ) -> QuotaState {
        // The same quotient in 64 bits when the product fits, without a 128-bit division,
        // and none at all without a weight.
        let weight = match u64::try_from(weighted) {
            Ok(0) => 0,
            Ok(x) => u128::from(x.div_ceil(self.width.max(1))),
            Err(_) => weighted.div_ceil(u128::from(self.width)),
        };
        let used = u128::from(cur) + weight;
        let remaining = u128::from(self.limit).saturating_sub(used) as u64;
        let reset = if cur > 0 {
            self.end(self.end(start)).saturating_sub(now)
        } else if prev > 0 {
            self.end(start).saturating_sub(now)
        } else {
            0
        };
        QuotaState::counted(self.limit, remaining, reset)
    }

    #[inline]
    pub(super) fn counter_idle_at(&self, words: Words) -> u64 {
        let [start, counts] = words;
        let (mut prev, cur) = unpack(counts);
        if start < self.gone_cur {
            return 0;
        }
        if start < self.gone {
            prev = 0;
        }
        if cur > 0 {
            self.end(self.end(start))
        } else if prev > 0 {
            self.end(start)
        } else {
            0
        }
    }

    /// The words once `units` counted in the window that opened at `spot[0]` are given back
    /// at `now`: from that window's count while it is the current or the previous one (it
    /// still weighs), not at all once it has passed.
    pub(super) fn counter_refund(&self, words: Words, now: u64, spot: Words, units: u32) -> Words {
        let (start, mut prev, mut cur) = self.counter_current(words, now);
        let u = u64::from(units);
        if prev == 0 && cur == 0 {
            return [0, 0];
        }
        if start == spot[0] {
            cur = cur.saturating_sub(u);
        } else if self.end(spot[0]) == start {
            prev = prev.saturating_sub(u);
        } else {
            return words;
        }
        if prev == 0 && cur == 0 {
            [0, 0]
        } else {
            [start, pack(prev, cur)]
        }
    }

    // ---- sliding-window log ----

    /// The step of a log quota, and the log's running total before its window (see
    /// [`Log::held_after`]).
    #[inline(always)]
    pub(super) fn log_step(&self, log: &Log, now: u64, cost: u32) -> (Step, u64) {
        let c = u64::from(cost);
        let (first, n, below) = log.window(now, self.width, self.gone);
        if c > self.limit {
            return (Step::Never, below);
        }
        if n.saturating_add(c) <= self.limit {
            // The cost lands in the request's own entry of the log.
            let step = Step::Allow {
                words: [0, 0],
                spot: [log.time_of(now), 0],
            };
            return (step, below);
        }
        // The oldest entries in the window holding `n + c - limit` must leave it first.
        let t = log.reaching(first, n + c - self.limit).unwrap_or(now);
        let step = Step::Deny {
            retry_after: t.saturating_add(self.width).saturating_sub(now).max(1),
        };
        (step, below)
    }

    pub(super) fn log_state(&self, log: &Log, now: u64) -> QuotaState {
        let (_, n) = log.in_window(now, self.width, self.gone);
        self.log_figures(n, log.newest().unwrap_or(0), now)
    }

    /// When a key whose log is `log` becomes equal to one never seen under this log quota:
    /// when its newest entry leaves the window (at once if it is gone already).
    #[inline]
    pub(super) fn log_idle_at(&self, log: &Log) -> u64 {
        self.log_idle_after(log.newest())
    }

    /// [`log_idle_at`](Self::log_idle_at) of a log whose newest entry is at `newest`.
    #[inline]
    pub(super) fn log_idle_after(&self, newest: Option<u64>) -> u64 {
        match newest {
            Some(t) if t >= self.gone => t.saturating_add(self.width),
            _ => 0,
        }
    }

    /// The figures of a log quota whose window holds `n` at `now`, in a log whose newest
    /// entry is at `newest`.
    #[inline]
    pub(super) fn log_figures(&self, n: u64, newest: u64, now: u64) -> QuotaState {
        let reset = if n > 0 {
            newest.saturating_add(self.width).saturating_sub(now)
        } else {
            0
        };
        QuotaState::counted(self.limit, self.limit.saturating_sub(n), reset)
    }
}
