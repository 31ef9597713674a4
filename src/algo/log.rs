//! The sliding log's record of a key's admitted requests, shared by every log quota of a
//! policy.

use std::collections::VecDeque;

/// A key's admitted requests, oldest first: one entry per time at which requests (or settled
/// charges) were recorded, with the running total of costs through it; kept as long as the longest
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
        let (first, held, _) = self.window(now, width, gone);
        (first, held)
    }

    /// [`in_window`](Self::in_window), and the running total before that window (what
    /// [`held_after`](Self::held_after) reads the window from after a record).
    #[inline]
    pub(crate) fn window(&self, now: u64, width: u64, gone: u64) -> (usize, u64, u64) {
        let out = |t: u64| t.saturating_add(width) <= now || t < gone;
        let (first, below) = match self.entries.front() {
            // The oldest entry still counts, and so do all the later ones: no search.
            Some(&(t, _)) if !out(t) => (0, self.base),
            Some(_) => {
                let first = self.entries.partition_point(|&(t, _)| out(t));
                (first, self.before(first))
            }
            None => (0, self.base),
        };
        (first, self.total() - below, below)
    }

    /// What a window of `width` at `now` (not before `gone`) holds, for a log whose newest
    /// entry is `newest` (its time and the running total through it) and whose running total
    /// before that window was `below` when [`window`](Self::window) last looked at `now`, or
    /// was since recorded at `now`: the window is the log's newest entries, so it holds what
    /// came after `below`, or nothing when its newest entry is out of it. The newest entry
    /// is read once, for every log quota.
    #[inline]
    pub(crate) fn held_after(
        newest: Option<(u64, u64)>,
        below: u64,
        now: u64,
        width: u64,
        gone: u64,
    ) -> u64 {
        match newest {
            Some((t, total)) if t.saturating_add(width) > now && t >= gone => total - below,
            _ => 0,
        }
    }

    /// The newest entry: its time and the running total through it.
    #[inline]
    pub(crate) fn newest_entry(&self) -> Option<(u64, u64)> {
        self.entries.back().copied()
    }

    /// The running total before entry `i`.
    #[inline]
    fn before(&self, i: usize) -> u64 {
        match i.checked_sub(1) {
            Some(j) => self.entries[j].1,
            None => self.base,
        }
    }

    /// The running total through the newest entry.
    #[inline]
    pub(crate) fn total(&self) -> u64 {
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
    /// `width` or less can see any more. A request recorded at the newest entry's time joins
    /// that entry: every window counts the two together, and a refund gives back from what
    /// that time holds (see [`give_back`](Self::give_back)). The buffer grows from 4 entries
    /// to 16, then by doubling, but not past `limit` entries (the most requests a window of
    /// that count admits) while it holds fewer.
    /// Returns the newest entry after it (see [`newest_entry`](Self::newest_entry)).
    #[inline(always)]
    pub(crate) fn admit(
        &mut self,
        now: u64,
        cost: u64,
        width: u64,
        limit: u64,
    ) -> Option<(u64, u64)> {
        self.trim(now, width);
        if cost == 0 {
            return self.newest_entry();
        }
        // Recorded at the later of `now` and the newest entry's time (see `time_of`): at
        // the newest entry's time, it joins that entry.
        let total = match self.entries.back_mut() {
            Some(newest) if newest.0 >= now => {
                newest.1 = newest.1.saturating_add(cost);
                return Some(*newest);
            }
            Some(newest) => newest.1,
            None => self.base,
        };
        let (at, total) = (now, total.saturating_add(cost));
        if self.entries.len() == self.entries.capacity() {
            self.grow(limit);
        }
        self.entries.push_back((at, total));
        Some((at, total))
    }

    /// Makes room for one more entry: 4 entries first, then 16 (a key's few first requests
    /// reallocate once, not twice), then doubling, never past `limit` entries while it holds
    /// fewer; never more than four times what it holds.
    #[cold]
    #[inline(never)]
    fn grow(&mut self, limit: u64) {
        let len = self.entries.len();
        let room = usize::try_from(limit)
            .unwrap_or(usize::MAX)
            .saturating_sub(len);
        let more = if len < 16 { (3 * len).max(4) } else { len };
        self.entries.reserve_exact(more.min(room.max(1)));
    }

    /// Before a charge of `cost`: when the running total through it would pass 2^63, counts
    /// the totals from 0 before the oldest entry again. What any window holds stays, and the
    /// total shrinks to what the log holds. A request costs at most [`MAX_LOG_COUNT`] and a
    /// charge less than 2^32, so totals stay exact: only charges bring them near 2^63, and
    /// from there requests would need 2^49 admissions to reach 2^64.
    ///
    /// [`MAX_LOG_COUNT`]: crate::Quota::MAX_LOG_COUNT
    pub(crate) fn room_for(&mut self, cost: u64) {
        if self.total().saturating_add(cost) > 1 << 63 {
            self.rebase();
        }
    }

    #[cold]
    fn rebase(&mut self) {
        let base = self.base;
        for e in &mut self.entries {
            e.1 -= base;
        }
        self.base = 0;
    }

    /// Drops the entries that no window of `width` can see at `now`, and gives memory back
    /// as the log shrinks: the buffer never has room for more than four times what it holds
    /// (or 16 entries).
    #[inline(always)]
    fn trim(&mut self, now: u64, width: u64) {
        // Most records drop nothing: the oldest entry still counts, and the buffer is not
        // four times too large.
        match self.entries.front() {
            Some(&(t, _)) if t.saturating_add(width) <= now => self.trim_out(now, width),
            _ => {
                if self.entries.capacity() > 16 && self.entries.capacity() > 4 * self.entries.len()
                {
                    self.trim_out(now, width);
                }
            }
        }
    }

    /// [`trim`](Self::trim) when it drops entries or gives memory back.
    #[cold]
    #[inline(never)]
    fn trim_out(&mut self, now: u64, width: u64) {
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

    /// Gives back `units` of the request recorded at `time`: the entry of that time (its own,
    /// and of any request recorded at the same time) loses them, at most what it holds, and
    /// goes once empty; other entries stay. Nothing when no entry has that time (it has left
    /// every window).
    pub(crate) fn give_back(&mut self, time: u64, units: u64) {
        let i = self.entries.partition_point(|&(t, _)| t < time);
        match self.entries.get(i) {
            Some(e) if e.0 == time && units > 0 => {}
            _ => return,
        }
        let own = self.entries[i].1 - self.before(i);
        let back = own.min(units);
        for e in self.entries.range_mut(i..) {
            e.1 -= back;
        }
        if back == own {
            self.entries.remove(i);
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use crate::algo::{
        all_or_nothing, concluded, decide, decide_many, KeyState, Rule, Step, Window, Words,
    };
    use crate::decision::{Decision, Outcome, QuotaState, Reservation, MAX_QUOTAS};

    /// The log as it was first kept: one entry per admitted request (or settlement), with its
    /// time and cost, dropped once out of the widest window; a refund takes from the newest
    /// entries of its time first.
    #[derive(Default)]
    struct Model {
        entries: Vec<(u64, u64)>,
    }

    impl Model {
        fn out(t: u64, now: u64, w: &Window) -> bool {
            t.saturating_add(w.width) <= now || t < w.gone
        }

        fn held(&self, now: u64, w: &Window) -> u64 {
            let n = self.entries.iter().filter(|e| !Self::out(e.0, now, w));
            n.map(|e| e.1).sum()
        }

        fn time_of(&self, now: u64) -> u64 {
            self.entries.last().map_or(now, |e| e.0.max(now))
        }

        fn step(&self, w: &Window, now: u64, cost: u32) -> Step {
            let c = u64::from(cost);
            if c > w.limit {
                return Step::Never;
            }
            let n = self.held(now, w);
            if n + c <= w.limit {
                let spot = [self.time_of(now), 0];
                return Step::Allow {
                    words: [0; 2],
                    spot,
                };
            }
            // The oldest entries of the window whose costs reach `n + c - limit` leave first.
            let (mut sum, mut t) = (0, now);
            for e in self.entries.iter().filter(|e| !Self::out(e.0, now, w)) {
                sum += e.1;
                if sum >= n + c - w.limit {
                    t = e.0;
                    break;
                }
            }
            let retry_after = t.saturating_add(w.width).saturating_sub(now).max(1);
            Step::Deny { retry_after }
        }

        fn state(&self, w: &Window, now: u64) -> QuotaState {
            let n = self.held(now, w);
            let reset = match self.entries.last() {
                Some(e) if n > 0 => e.0.saturating_add(w.width).saturating_sub(now),
                _ => 0,
            };
            QuotaState::counted(w.limit, w.limit.saturating_sub(n), reset)
        }

        fn admit(&mut self, now: u64, cost: u64, width: u64) {
            self.entries.retain(|e| e.0.saturating_add(width) > now);
            if cost > 0 {
                let at = self.time_of(now);
                self.entries.push((at, cost));
            }
        }

        fn give_back(&mut self, time: u64, mut units: u64) {
            for i in (0..self.entries.len()).rev() {
                if self.entries[i].0 == time && units > 0 {
                    let back = self.entries[i].1.min(units);
                    units -= back;
                    self.entries[i].1 -= back;
                }
            }
            self.entries.retain(|e| e.1 > 0);
        }

        fn idle_at(&self, w: &Window) -> u64 {
            match self.entries.last() {
                Some(e) if e.0 >= w.gone => e.0.saturating_add(w.width),
                _ => 0,
            }
        }
    }

    /// A key's state under the model: GCRA's words, and the model's log.
    #[derive(Default)]
    struct Reference {
        words: [Words; MAX_QUOTAS],
        log: Model,
    }

    impl Reference {
        fn widest(rules: &[Rule]) -> Option<(u64, u64)> {
            let logs = rules.iter().filter_map(|r| match r {
                Rule::SlidingLog(w) => Some((w.width, w.limit)),
                _ => None,
            });
            logs.reduce(|a, b| (a.0.max(b.0), a.1.max(b.1)))
        }

        fn decide(
            &mut self,
            rules: &[Rule],
            now: u64,
            cost: u32,
        ) -> (Outcome, u64, Vec<QuotaState>, Reservation) {
            let n = rules.len();
            let v = all_or_nothing(n, |i| match &rules[i] {
                Rule::SlidingLog(w) => self.log.step(w, now, cost),
                r => r.step(self.words[i], &super::Log::EMPTY, now, cost),
            });
            if v.outcome == Outcome::Allowed && cost > 0 {
                self.words[..n].copy_from_slice(&v.words[..n]);
                if let Some((width, _)) = Self::widest(rules) {
                    self.log.admit(now, u64::from(cost), width);
                }
            }
            let mut quotas = [QuotaState::default(); MAX_QUOTAS];
            for (i, r) in rules.iter().enumerate() {
                quotas[i] = match r {
                    Rule::SlidingLog(w) => self.log.state(w, now),
                    r => r.state(self.words[i], &super::Log::EMPTY, now),
                };
            }
            let d = concluded(&v, cost, quotas, n);
            (
                d.outcome(),
                d.retry_after().map_or(0, |t| t.as_nanos() as u64),
                d.states().to_vec(),
                Reservation::of(&d, cost),
            )
        }

        fn charge(&mut self, rules: &[Rule], now: u64, cost: u32) {
            for (i, r) in rules.iter().enumerate() {
                self.words[i] = r.charge(self.words[i], now, cost);
            }
            if let Some((width, _)) = Self::widest(rules) {
                self.log.admit(now, u64::from(cost), width);
            }
        }

        fn refund(&mut self, rules: &[Rule], now: u64, taken: &Reservation, units: u32) {
            let units = units.min(taken.cost);
            if units == 0 {
                return;
            }
            for (i, r) in rules.iter().enumerate() {
                self.words[i] = r.refund(self.words[i], now, taken.spots[i], taken.cost, units);
            }
            if let Some(i) = rules.iter().position(|r| matches!(r, Rule::SlidingLog(_))) {
                self.log.give_back(taken.spots[i][0], u64::from(units));
            }
        }

        fn idle_at(&self, rules: &[Rule]) -> u64 {
            let each = rules.iter().enumerate().map(|(i, r)| match r {
                Rule::SlidingLog(w) => self.log.idle_at(w),
                r => r.idle_at_two(self.words[i]),
            });
            each.max().unwrap_or(0)
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        /// A request of this cost, this long after the last operation (often none: requests
        /// at one instant share an entry).
        Decide(u64, u32),
        /// A settlement of this cost.
        Charge(u64, u32),
        /// A refund of units of the `n`-th admission kept (from the newest when `oldest` is
        /// false), of at most its cost.
        Refund(u64, usize, bool, u32),
        /// The quotas' windows become these widths (a live change).
        Widths(u64, u64, u64),
        /// The key is dropped if it is idle (a sweep).
        Evict(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        let gap = prop_oneof![3 => Just(0u64), 3 => 0u64..30, 1 => 0u64..400];
        prop_oneof![
            8 => (gap.clone(), prop_oneof![3 => 1u32..3, 1 => 0u32..12]).prop_map(|(g, c)| Op::Decide(g, c)),
            1 => (gap.clone(), 0u32..20).prop_map(|(g, c)| Op::Charge(g, c)),
            3 => (gap.clone(), 0usize..8, any::<bool>(), 0u32..12).prop_map(|(g, n, o, u)| Op::Refund(g, n, o, u)),
            1 => (gap.clone(), 1u64..300, 1u64..300).prop_map(|(g, a, b)| Op::Widths(g, a, b)),
            1 => gap.prop_map(Op::Evict),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// The log kept as one entry per instant, with each log quota's figures read from its
        /// step, decides, reports and gives back what the log of one entry per request
        /// decided, reported and gave back: over requests at one instant and apart, costs
        /// above 1, settlements, refunds of the newest, oldest or a middle admission, live
        /// changes of window and the eviction of idle keys; with one or two log quotas, and
        /// beside a GCRA quota. A policy of one log quota decides, on its own path, as the
        /// general decision over every quota does.
        #[test]
        fn a_log_of_one_entry_per_instant_decides_as_one_entry_per_request(
            limits in (1u64..8, 1u64..12),
            widths in (1u64..300, 1u64..300),
            shape in 0usize..3,
            ops in prop::collection::vec(op(), 1..80),
        ) {
            let logs = [
                Rule::SlidingLog(Window::new(limits.0, widths.0)),
                Rule::SlidingLog(Window::new(limits.1, widths.1)),
            ];
            let gcra = Rule::Gcra(crate::algo::Gcra::new(20, 60));
            let mut rules: Vec<Rule> = match shape {
                0 => vec![logs[0]],
                1 => vec![logs[0], logs[1]],
                _ => vec![gcra, logs[0], logs[1]],
            };
            let mut now = 1_000;
            let mut state = KeyState::default();
            let mut model = Reference::default();
            let mut taken: Vec<Reservation> = Vec::new();
            for op in ops {
                match op {
                    Op::Decide(gap, cost) => {
                        now += gap;
                        // The general decision over every quota, on a copy of the state.
                        let mut general = state.clone();
                        let mut g = Decision::unlimited();
                        decide_many(&rules, &mut general, now, cost, &mut g);
                        let (d, _) = decide(&rules, &mut state, now, cost);
                        prop_assert_eq!(&general, &state);
                        prop_assert_eq!(format!("{g:?}"), format!("{d:?}"));
                        let ours = (d.outcome(), d.retry_after().map_or(0, |t| t.as_nanos() as u64), d.states().to_vec(), Reservation::of(&d, cost));
                        let theirs = model.decide(&rules, now, cost);
                        prop_assert_eq!(&ours, &theirs, "at {}", now);
                        if ours.3.cost > 0 {
                            taken.push(ours.3);
                        }
                    }
                    Op::Charge(gap, cost) => {
                        now += gap;
                        state.charge(&rules, now, cost);
                        model.charge(&rules, now, cost);
                    }
                    Op::Refund(gap, n, oldest, units) => {
                        now += gap;
                        if !taken.is_empty() {
                            let i = n % taken.len();
                            let i = if oldest { i } else { taken.len() - 1 - i };
                            let t = taken.remove(i);
                            state.refund(&rules, now, &t, units);
                            model.refund(&rules, now, &t, units);
                        }
                    }
                    Op::Widths(gap, a, b) => {
                        now += gap;
                        let old = rules.clone();
                        let mut widths = [a, b].into_iter();
                        for r in rules.iter_mut() {
                            if let Rule::SlidingLog(w) = r {
                                let width = widths.next().unwrap_or(a);
                                *r = Rule::SlidingLog(Window::new(w.limit, width));
                            }
                        }
                        Rule::replacing(&mut rules, &old, now);
                    }
                    Op::Evict(gap) => {
                        now += gap;
                        let idle = state.idle_at(&rules);
                        prop_assert_eq!(idle, model.idle_at(&rules));
                        if idle <= now {
                            state = KeyState::default();
                            model = Reference::default();
                        }
                    }
                }
            }
        }
    }

    /// Running totals near 2^63 (after many debts, the log never empty): a charge counts them
    /// from 0 again first, and every window holds what it held, the charge's whole cost on top.
    #[test]
    fn a_charge_near_the_top_of_the_running_total_counts_it_from_zero_and_holds_the_same() {
        let top = 1u64 << 63;
        let rules = [Rule::SlidingLog(Window::new(10_000, 10))];
        let mut state = KeyState {
            log: super::Log {
                entries: [(1, top - 100), (5, top - 40), (8, top - 30)].into(),
                base: top - 200,
            },
            ..KeyState::default()
        };
        let held = |s: &KeyState, now, width| s.log.in_window(now, width, 0).1;
        assert_eq!(held(&state, 8, 10), 170);
        assert_eq!(held(&state, 8, 5), 70);
        state.charge(&rules, 9, u32::MAX);
        let all = 170 + u64::from(u32::MAX);
        assert_eq!(state.log.base, 0);
        assert_eq!(state.log.total(), all);
        assert_eq!(held(&state, 9, 10), all);
        assert_eq!(held(&state, 9, 5), 70 + u64::from(u32::MAX));
        assert_eq!(state.log.reaching(0, 100), Some(1));
        assert_eq!(state.log.reaching(0, 101), Some(5));
        // Far below the top, a charge leaves the totals as they are.
        let mut low = KeyState::default();
        low.charge(&rules, 0, u32::MAX);
        low.charge(&rules, 1, u32::MAX);
        assert_eq!(low.log.total(), 2 * u64::from(u32::MAX));
    }
}
