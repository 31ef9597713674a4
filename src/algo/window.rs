//! The window kinds: fixed window, sliding-window log, sliding-window counter.
//!
//! Windows belong to the key: the first admitted request of an idle key opens a window of
//! `width`, and windows follow one another from there for as long as the key stays busy. No
//! kind depends on where the clock's origin lies, so the memory store and Redis (whose clock
//! is the server's) agree to the nanosecond, and keys do not all reset at the same instant.
//!
//! Fixed window, words `[start, used]`:
//! ```text
//! window  = (start, used) if used > 0 and now < start + width, else (now, 0)
//! allow   = used + c <= limit                       store (start, used + c)
//! retry   = start + width - now                     (the next window takes any c <= limit)
//! ```
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
//! Sliding-window log: the [`Log`](super::Log) of unit times. With `n` entries inside
//! `(now - width, now]`:
//! ```text
//! allow   = n + c <= limit
//! retry   = t_k + width - now       t_k: the (n + c - limit)-th oldest entry in the window
//! ```

use super::{Log, Step, Words};
use crate::gcra::QuotaState;

/// A window quota: at most `limit` per `width` nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Window {
    pub(crate) limit: u64,
    pub(crate) width: u64,
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
    /// The end of a window opened at `start`, never past the clock's range.
    #[inline]
    fn end(&self, start: u64) -> u64 {
        start.saturating_add(self.width)
    }

    // ---- fixed window ----

    /// The current window at `now`: its start and what it has used.
    #[inline]
    fn fixed_current(&self, words: Words, now: u64) -> (u64, u64) {
        let [start, used] = words;
        if used > 0 && now < self.end(start) {
            (start, used)
        } else {
            (now, 0)
        }
    }

    pub(super) fn fixed_step(&self, words: Words, now: u64, cost: u32) -> Step {
        let c = u64::from(cost);
        if c > self.limit {
            return Step::Never;
        }
        let (start, used) = self.fixed_current(words, now);
        if used + c <= self.limit {
            Step::Allow([start, used + c])
        } else {
            Step::Deny {
                retry_after: self.end(start).saturating_sub(now).max(1),
            }
        }
    }

    /// The words once `cost` is taken whatever the limit: counted in the current window.
    pub(super) fn fixed_charge(&self, words: Words, now: u64, cost: u32) -> Words {
        let (start, used) = self.fixed_current(words, now);
        [start, used.saturating_add(u64::from(cost))]
    }

    pub(super) fn fixed_state(&self, words: Words, now: u64) -> QuotaState {
        let (start, used) = self.fixed_current(words, now);
        let reset = if used > 0 {
            self.end(start).saturating_sub(now)
        } else {
            0
        };
        QuotaState::counted(self.limit, self.limit.saturating_sub(used), reset)
    }

    pub(super) fn fixed_idle_at(&self, words: Words) -> u64 {
        let [start, used] = words;
        if used > 0 {
            self.end(start)
        } else {
            0
        }
    }

    pub(super) fn fixed_refund(&self, words: Words, now: u64, cost: u32) -> Words {
        let (start, used) = self.fixed_current(words, now);
        let used = used.saturating_sub(u64::from(cost));
        if used == 0 {
            [0, 0]
        } else {
            [start, used]
        }
    }

    // ---- sliding-window counter ----

    /// The current fixed window at `now`: its start, the previous window's count and its own.
    #[inline]
    fn counter_current(&self, words: Words, now: u64) -> (u64, u64, u64) {
        let [start, counts] = words;
        let (prev, cur) = unpack(counts);
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

    pub(super) fn counter_step(&self, words: Words, now: u64, cost: u32) -> Step {
        let c = u64::from(cost);
        if c > self.limit {
            return Step::Never;
        }
        let (start, prev, cur) = self.counter_current(words, now);
        let w = u128::from(self.width);
        let limit = u128::from(self.limit);
        let weighted = self.weighted(start, prev, now);
        if u128::from(cur + c) * w + weighted <= limit * w {
            return Step::Allow([start, pack(prev, cur + c)]);
        }
        // The first elapsed time `e'` of a window at which `count × (width − e') <= room ×
        // width`, with `count` the weight that must fall and `room` what may stay.
        let first_fit = |count: u64, room: u64| -> u64 {
            if count == 0 {
                return 0;
            }
            let keep = (u128::from(room) * w) / u128::from(count);
            self.width - keep.min(w) as u64
        };
        let at = if cur + c <= self.limit {
            start.saturating_add(first_fit(prev, self.limit - cur - c))
        } else {
            self.end(start)
                .saturating_add(first_fit(cur, self.limit - c))
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

    pub(super) fn counter_state(&self, words: Words, now: u64) -> QuotaState {
        let (start, prev, cur) = self.counter_current(words, now);
        let w = u128::from(self.width);
        let weight = self.weighted(start, prev, now).div_ceil(w);
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

    pub(super) fn counter_idle_at(&self, words: Words) -> u64 {
        let [start, counts] = words;
        let (prev, cur) = unpack(counts);
        if cur > 0 {
            self.end(self.end(start))
        } else if prev > 0 {
            self.end(start)
        } else {
            0
        }
    }

    pub(super) fn counter_refund(&self, words: Words, now: u64, cost: u32) -> Words {
        let (start, prev, cur) = self.counter_current(words, now);
        let c = u64::from(cost);
        let from_cur = c.min(cur);
        let prev = prev.saturating_sub(c - from_cur);
        let cur = cur - from_cur;
        if prev == 0 && cur == 0 {
            [0, 0]
        } else {
            [start, pack(prev, cur)]
        }
    }

    // ---- sliding-window log ----

    pub(super) fn log_step(&self, log: &Log, now: u64, cost: u32) -> Step {
        let c = u64::from(cost);
        if c > self.limit {
            return Step::Never;
        }
        let (first, n) = log.in_window(now, self.width);
        let n = n as u64;
        if n + c <= self.limit {
            return Step::Allow([0, 0]);
        }
        // The oldest `n + c - limit` entries in the window must leave it first.
        let k = (n + c - self.limit) as usize;
        let t = log.get(first + k - 1).unwrap_or(now);
        Step::Deny {
            retry_after: t.saturating_add(self.width).saturating_sub(now).max(1),
        }
    }

    pub(super) fn log_state(&self, log: &Log, now: u64) -> QuotaState {
        let (_, n) = log.in_window(now, self.width);
        let reset = match log.newest() {
            Some(t) if n > 0 => t.saturating_add(self.width).saturating_sub(now),
            _ => 0,
        };
        QuotaState::counted(self.limit, self.limit.saturating_sub(n as u64), reset)
    }
}
