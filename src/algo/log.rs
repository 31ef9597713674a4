//! The sliding log's record of a key's admitted requests, shared by every log quota of a
//! policy.

use std::collections::VecDeque;

/// A key's admitted requests, oldest first: one entry per request (or settled charge), with
/// its time and the running total of costs through it; kept as long as the longest
/// sliding-log window of the policy. A log of `n` entries holds `16 n` bytes in its buffer,
/// which is never more than four times what it holds (and at least 16 entries).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Log {
    /// `(time, running total of costs through this entry)`, times in order.
    entries: VecDeque<(u64, u64)>,
    /// The running total before the first entry.
    base: u64,
}

impl Log {
    /// The log of a key no request has reached: what a quota kept in two words is shown.
    pub(crate) const EMPTY: Log = Log {
        entries: VecDeque::new(),
        base: 0,
    };

    /// The first entry still inside a window of `width` at `now` (times `t` with
    /// `t + width > now`, and not before `gone`: see [`Window::replacing`]), and the cost
    /// those entries hold.
    #[inline]
    pub(crate) fn in_window(&self, now: u64, width: u64, gone: u64) -> (usize, u64) {
        let out = |t: u64| t.saturating_add(width) <= now || t < gone;
        let first = match self.entries.front() {
            // The oldest entry still counts, and so do all the later ones: no search.
            Some(&(t, _)) if !out(t) => return (0, self.total() - self.base),
            Some(_) => self.entries.partition_point(|&(t, _)| out(t)),
            None => 0,
        };
        (first, self.total() - self.before(first))
    }

    /// The running total before entry `i`.
    #[inline]
    fn before(&self, i: usize) -> u64 {
        match i.checked_sub(1) {
            Some(j) => self.entries[j].1,
            None => self.base,
        }
    }

    #[inline]
    fn total(&self) -> u64 {
        self.entries.back().map_or(self.base, |e| e.1)
    }

    /// The time of the entry, from `first` on, at which the cost counted from `first`
    /// reaches `units`.
    pub(crate) fn reaching(&self, first: usize, units: u64) -> Option<u64> {
        let goal = self.before(first).saturating_add(units);
        let i = self.entries.partition_point(|&(_, c)| c < goal);
        self.entries.get(i).map(|e| e.0)
    }

    pub(crate) fn newest(&self) -> Option<u64> {
        self.entries.back().map(|e| e.0)
    }

    /// The time a request admitted at `now` is recorded at. A time earlier than the newest
    /// entry (a reading of the clock taken before another thread's decision) is recorded as
    /// the newest: later, never earlier, so the log stays sorted and never admits more than
    /// it should.
    #[inline]
    pub(crate) fn time_of(&self, now: u64) -> u64 {
        self.newest().map_or(now, |t| t.max(now))
    }

    /// The number of entries and the entries the buffer has room for.
    #[cfg(test)]
    pub(crate) fn sizes(&self) -> (usize, usize) {
        (self.entries.len(), self.entries.capacity())
    }

    /// Records a request of `cost` admitted at `now`, after dropping what no window of
    /// `width` or less can see any more. The buffer grows by doubling, but not past `limit`
    /// entries (the most requests a window of that count admits) while it holds fewer.
    pub(crate) fn admit(&mut self, now: u64, cost: u64, width: u64, limit: u64) {
        self.trim(now, width);
        if cost == 0 {
            return;
        }
        let len = self.entries.len();
        if len == self.entries.capacity() {
            let room = usize::try_from(limit)
                .unwrap_or(usize::MAX)
                .saturating_sub(len);
            self.entries.reserve_exact(len.max(4).min(room.max(1)));
        }
        let at = self.time_of(now);
        let total = self.total().saturating_add(cost);
        self.entries.push_back((at, total));
    }

    /// Drops the entries that no window of `width` can see at `now`, and gives memory back
    /// as the log shrinks: the buffer never has room for more than four times what it holds
    /// (or 16 entries).
    fn trim(&mut self, now: u64, width: u64) {
        let (first, _) = self.in_window(now, width, 0);
        if first > 0 {
            self.base = self.entries[first - 1].1;
            self.entries.drain(..first);
        }
        let len = self.entries.len();
        if self.entries.capacity() > 16 && self.entries.capacity() > 4 * len {
            self.entries.shrink_to((2 * len).max(16));
        }
    }

    /// Gives back `units` of the request recorded at `time`: its own entry loses them (and
    /// goes once empty); entries of other requests stay. Nothing when no entry has that time
    /// (it has left every window).
    pub(crate) fn give_back(&mut self, time: u64, mut units: u64) {
        let mut i = self.entries.partition_point(|&(t, _)| t <= time);
        while units > 0 && i > 0 && self.entries[i - 1].0 == time {
            i -= 1;
            let own = self.entries[i].1 - self.before(i);
            let back = own.min(units);
            units -= back;
            for e in self.entries.range_mut(i..) {
                e.1 -= back;
            }
            if back == own {
                self.entries.remove(i);
            }
        }
    }
}
