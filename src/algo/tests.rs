use super::*;
use proptest::prelude::*;

const S: u64 = 1_000_000_000;

fn fixed(limit: u64, width: u64) -> Rule {
    Rule::FixedWindow(Window::new(limit, width))
}
fn log(limit: u64, width: u64) -> Rule {
    Rule::SlidingLog(Window::new(limit, width))
}
fn counter(limit: u64, width: u64) -> Rule {
    Rule::SlidingWindow(Window::new(limit, width))
}

fn all_kinds(limit: u64, width: u64) -> [Rule; 4] {
    [
        Rule::Gcra(Gcra::new(width / limit, width / limit * limit)),
        fixed(limit, width),
        log(limit, width),
        counter(limit, width),
    ]
}

/// What a change of quotas marks gone is the times before a bound, so the clock's first
/// reading (0) is marked gone by a change one width (log) or two widths (counter) after it,
/// and a bound of 0 marks nothing.
#[test]
fn a_change_a_window_after_the_clocks_first_reading_marks_that_reading_gone() {
    let narrow = Window::new(4, 400);
    let wide = |now| Window::new(4, 800).replacing(&narrow, now);
    assert_eq!((wide(399).gone, wide(399).gone_cur), (0, 0));
    assert_eq!((wide(400).gone, wide(400).gone_cur), (1, 0));
    assert_eq!((wide(800).gone, wide(800).gone_cur), (401, 1));
    assert_eq!(wide(u64::MAX).gone, u64::MAX - 399);
    let mut entries = Log::default();
    entries.admit(0, 1, u64::MAX / 2, u64::MAX);
    assert_eq!(entries.in_window(399, 800, wide(399).gone).1, 1);
    assert_eq!(entries.in_window(400, 800, wide(400).gone).1, 0);
    // A counter with one request in a window opened at 0.
    let words = [0, 1];
    let state = |w: Window, now| {
        Rule::SlidingWindow(w)
            .state(words, &Log::EMPTY, now)
            .remaining()
    };
    assert_eq!(state(wide(799), 799), 3);
    assert_eq!(state(wide(800), 800), 4);
}

#[test]
fn a_cost_above_the_count_never_passes_at_any_time_and_takes_nothing() {
    for r in all_kinds(5, S) {
        for now in [0, 1, S, u64::MAX / 2, u64::MAX - 1, u64::MAX] {
            for cost in [6, u32::MAX] {
                let mut st = KeyState::default();
                let (d, changed) = decide(&[r], &mut st, now, cost);
                assert_eq!(d.outcome(), Outcome::Exceeds, "{r:?} at {now}");
                assert!(!changed);
                assert_eq!(st, KeyState::default());
                assert_eq!(d.retry_after(), None);
            }
        }
    }
}

#[test]
fn cost_zero_reports_and_stores_nothing() {
    for r in all_kinds(5, S) {
        let mut st = KeyState::default();
        let (d, changed) = decide(&[r], &mut st, 7, 0);
        assert!(d.is_allowed());
        assert!(!changed);
        assert_eq!(d.remaining(), 5, "{r:?}");
        assert_eq!(d.reset_after().as_nanos(), 0, "{r:?}");
    }
}

#[test]
fn windows_of_one_nanosecond_and_of_a_century_decide_without_overflow() {
    let century = 100 * 365 * 86_400 * S;
    for width in [1, century, u64::MAX / 4] {
        for r in [fixed(3, width), log(3, width), counter(3, width)] {
            for start in [0, 1, u64::MAX - 2 * width.min(u64::MAX / 4), u64::MAX - 1] {
                let mut st = KeyState::default();
                if matches!(r, Rule::FixedWindow(_)) && start.checked_add(width).is_none() {
                    // A window that would end past the clock's last nanosecond does not open.
                    assert_eq!(
                        decide(&[r], &mut st, start, 1).0.outcome(),
                        Outcome::Limited
                    );
                    continue;
                }
                assert!(decide(&[r], &mut st, start, 3).0.is_allowed(), "{r:?}");
                let (d, _) = decide(&[r], &mut st, start, 1);
                assert_eq!(d.outcome(), Outcome::Limited, "{r:?} at {start}");
                let wait = d.retry_after().map(|w| w.as_nanos() as u64).unwrap_or(0);
                assert!(wait >= 1 && wait <= 2 * width, "{r:?}: {wait}");
            }
        }
    }
}

#[test]
fn a_refund_of_more_than_was_taken_leaves_an_idle_key_never_a_credit() {
    for r in all_kinds(4, S) {
        let mut st = KeyState::default();
        let (d, _) = decide(&[r], &mut st, 10, 2);
        assert!(d.is_allowed());
        st.refund(&[r], 10, &Reservation::of(&d, 2), u32::MAX);
        assert!(st.idle_at(&[r]) <= 10, "{r:?}");
        // Exactly the count again, not more.
        assert!(decide(&[r], &mut st, 10, 4).0.is_allowed(), "{r:?}");
        assert_eq!(decide(&[r], &mut st, 10, 1).0.outcome(), Outcome::Limited);
    }
}

#[test]
fn a_log_refund_gives_back_the_requests_own_entry_not_the_newest() {
    let r = log(3, 10 * S);
    let mut st = KeyState::default();
    let (slow, _) = decide(&[r], &mut st, 0, 1);
    assert!(slow.is_allowed());
    assert!(decide(&[r], &mut st, 5 * S, 2).0.is_allowed());
    // The request of 0 s gives its unit back at 6 s: the entry of 5 s stays.
    st.refund(&[r], 6 * S, &Reservation::of(&slow, 1), 1);
    let (d, _) = decide(&[r], &mut st, 6 * S, 2);
    assert_eq!(d.retry_after(), Some(std::time::Duration::from_secs(9)));
    assert!(decide(&[r], &mut st, 6 * S, 1).0.is_allowed());
}

#[test]
fn mixed_kinds_where_one_rejects_consume_from_none() {
    let rules = [fixed(10, S), log(2, S), counter(10, S)];
    let mut st = KeyState::default();
    assert!(decide(&rules, &mut st, 0, 2).0.is_allowed());
    let before = st.clone();
    let (d, changed) = decide(&rules, &mut st, 1, 1);
    assert_eq!(d.outcome(), Outcome::Limited);
    assert!(!changed);
    assert_eq!(st, before);
    let remaining: Vec<u64> = d.states().iter().map(|s| s.remaining()).collect();
    assert_eq!(remaining, [8, 0, 8]);
}

/// One request in a generated run: after `gap` ns, cost `cost`.
fn run() -> impl Strategy<Value = Vec<(u64, u32)>> {
    prop::collection::vec((0u64..400, 0u32..4), 1..120)
}

fn kind_rule(k: u8, limit: u64, width: u64) -> Rule {
    match k {
        0 => fixed(limit, width),
        1 => log(limit, width),
        _ => counter(limit, width),
    }
}

proptest! {
    /// The idle rule: once the key's state says it is idle, it decides every request exactly as
    /// a key never seen (so the keyed table may forget it).
    #[test]
    fn an_idle_key_decides_like_one_never_seen(
        kinds in prop::collection::vec(0u8..3, 1..4),
        limit in 1u64..6,
        width in 1u64..500,
        reqs in run(),
        later in 0u64..1000,
        after in run(),
    ) {
        let rules: Vec<Rule> = kinds.iter().map(|&k| kind_rule(k, limit, width)).collect();
        let mut st = KeyState::default();
        let mut now = 1;
        for (gap, c) in reqs {
            now += gap;
            let _ = decide(&rules, &mut st, now, c);
        }
        let mut at = st.idle_at(&rules).max(now) + later;
        let mut fresh = KeyState::default();
        for (gap, c) in after {
            at += gap;
            let (a, _) = decide(&rules, &mut st, at, c);
            let (b, _) = decide(&rules, &mut fresh, at, c);
            prop_assert_eq!(a, b);
        }
    }

    /// The sliding log admits at most `limit` units in every window `[t, t + width)`, checked at
    /// every admission.
    #[test]
    fn the_log_never_admits_more_than_n_in_any_window(
        limit in 1u64..8, width in 1u64..1000, reqs in run(),
    ) {
        let rules = [log(limit, width)];
        let mut st = KeyState::default();
        let mut now = 0;
        let mut admitted: Vec<(u64, u64)> = Vec::new();
        for (gap, c) in reqs {
            now += gap;
            if decide(&rules, &mut st, now, c).0.is_allowed() && c > 0 {
                admitted.push((now, u64::from(c)));
            }
        }
        for &(t, _) in &admitted {
            let n: u64 = admitted.iter().filter(|(u, _)| *u >= t && *u < t + width).map(|x| x.1).sum();
            prop_assert!(n <= limit, "{} in [{}, {})", n, t, t + width);
        }
    }

    /// The log admits whenever it may: a request rejected by it would have put more than
    /// `limit` in the window ending now, and its retry time is exact.
    #[test]
    fn the_log_rejects_only_when_it_must_and_its_retry_is_exact(
        limit in 1u64..8, width in 1u64..1000, reqs in run(),
    ) {
        let rules = [log(limit, width)];
        let mut st = KeyState::default();
        let mut now = 0;
        let mut admitted: Vec<u64> = Vec::new();
        for (gap, c) in reqs {
            now += gap;
            let in_window = |at: u64, adm: &[u64]| adm.iter().filter(|&&u| u + width > at).count() as u64;
            let (d, _) = decide(&rules, &mut st, now, c);
            if d.is_allowed() {
                prop_assert!(in_window(now, &admitted) + u64::from(c) <= limit);
                admitted.extend(std::iter::repeat(now).take(c as usize));
            } else if let Some(wait) = d.retry_after() {
                let wait = wait.as_nanos() as u64;
                prop_assert!(in_window(now, &admitted) + u64::from(c) > limit);
                prop_assert!(in_window(now + wait, &admitted) + u64::from(c) <= limit);
                prop_assert!(in_window(now + wait - 1, &admitted) + u64::from(c) > limit);
            }
        }
    }

    /// Fixed window: at most `limit` in one window (from its opening), at most `2 × limit` in
    /// any span of `width`.
    #[test]
    fn the_fixed_window_admits_n_per_window_and_2n_across_a_boundary(
        limit in 1u64..8, width in 1u64..1000, reqs in run(),
    ) {
        let rules = [fixed(limit, width)];
        let mut st = KeyState::default();
        let mut now = 0;
        let mut admitted: Vec<(u64, u64)> = Vec::new();
        for (gap, c) in reqs {
            now += gap;
            if decide(&rules, &mut st, now, c).0.is_allowed() && c > 0 {
                admitted.push((now, u64::from(c)));
            }
        }
        // Windows as the model opens them.
        let mut open: Option<u64> = None;
        let mut used = 0;
        for &(t, c) in &admitted {
            match open {
                Some(o) if t < o + width => used += c,
                _ => { open = Some(t); used = c; }
            }
            prop_assert!(used <= limit);
        }
        for &(t, _) in &admitted {
            let n: u64 = admitted.iter().filter(|(u, _)| *u >= t && *u < t + width).map(|x| x.1).sum();
            prop_assert!(n <= 2 * limit);
        }
    }

    /// Sliding counter: never more than `2 × limit - 1` in any span of `width`, and its retry
    /// time is exact.
    #[test]
    fn the_counter_stays_within_its_bound_and_its_retry_is_exact(
        limit in 1u64..8, width in 1u64..1000, reqs in run(),
    ) {
        let rules = [counter(limit, width)];
        let mut st = KeyState::default();
        let mut now = 0;
        let mut admitted: Vec<(u64, u64)> = Vec::new();
        for (gap, c) in reqs {
            now += gap;
            let (d, _) = decide(&rules, &mut st, now, c);
            if d.is_allowed() && c > 0 {
                admitted.push((now, u64::from(c)));
            } else if let Some(wait) = d.retry_after() {
                let wait = wait.as_nanos() as u64;
                let mut probe = st.clone();
                prop_assert!(decide(&rules, &mut probe, now + wait, c).0.is_allowed());
                let mut probe = st.clone();
                prop_assert!(!decide(&rules, &mut probe, now + wait - 1, c).0.is_allowed());
            }
        }
        for &(t, _) in &admitted {
            let n: u64 = admitted.iter().filter(|(u, _)| *u >= t && *u < t + width).map(|x| x.1).sum();
            prop_assert!(n < 2 * limit, "{} in [{}, {})", n, t, t + width);
        }
    }
}

#[test]
fn a_log_holds_one_entry_per_request_and_gives_memory_back_as_it_shrinks() {
    let r = log(10_000, 10 * S);
    let mut st = KeyState::default();
    for i in 0..10_000 {
        assert!(decide(&[r], &mut st, i, 1).0.is_allowed());
    }
    let (len, cap) = st.log.sizes();
    assert_eq!(len, 10_000);
    assert!(cap <= 16_384, "{cap}");
    // One request of 5 000 is one entry, however large its cost.
    let mut big = KeyState::default();
    assert!(decide(&[r], &mut big, 0, 5_000).0.is_allowed());
    assert_eq!(big.log.sizes().0, 1);
    // Once all but two have left the window, the buffer is at most 16 entries again.
    let later = 10 * S + 9_997;
    assert!(decide(&[r], &mut st, later, 1).0.is_allowed());
    let (len, cap) = st.log.sizes();
    assert_eq!(len, 2 + 1);
    assert!(cap <= 16, "{cap}");
}

#[test]
fn a_settled_charge_is_one_log_entry_kept_whole() {
    let rules = [log(3, S), log(5, 2 * S)];
    let mut st = KeyState::default();
    st.charge(&rules, 0, u32::MAX);
    assert_eq!(st.log.sizes().0, 1);
    // Out of the 1 s window at 1 s, out of the 2 s one at 2 s.
    assert_eq!(decide(&rules, &mut st, S, 1).0.outcome(), Outcome::Limited);
    assert!(decide(&rules, &mut st, 2 * S, 1).0.is_allowed());
}

/// The largest debts, u32::MAX each, at one instant and at the next, under the largest
/// limit: the log holds every unit (its running total is a u64, exact far beyond), so a
/// limit raised to u32::MAX still finds the window over it until both have left.
#[test]
fn the_largest_debts_stand_whole_under_the_largest_limit() {
    let rules = [log(3, 2 * S)];
    let raised = [log(u64::from(u32::MAX), 2 * S)];
    let mut st = KeyState::default();
    st.charge(&rules, 0, u32::MAX);
    st.charge(&rules, 0, u32::MAX);
    st.charge(&rules, 1, u32::MAX);
    assert_eq!(st.log.sizes().0, 2);
    let held = 3 * u64::from(u32::MAX);
    assert_eq!(st.log.in_window(1, 2 * S, 0), (0, held));
    let d = decide(&raised, &mut st, S, 1).0;
    assert_eq!(d.outcome(), Outcome::Limited);
    assert_eq!(d.states()[0].remaining(), 0);
    // At 2 s the two of time 0 leave; the one of 1 ns stays and fills the window alone.
    assert_eq!(
        decide(&raised, &mut st, 2 * S, 1).0.outcome(),
        Outcome::Limited
    );
    assert!(decide(&raised, &mut st, 2 * S + 1, 1).0.is_allowed());
}

proptest! {
    /// The sliding counter decides and reports by the exact products whether or not the
    /// previous window weighs (the test without a weight is the fixed window's, with no
    /// product): in a window opened at `start` with counts `prev` and `cur`, a request of `c`
    /// passes iff `(cur + c)·width + prev·(width − e) <= limit·width`, and `remaining` is
    /// `limit − cur − ⌈prev·(width − e) / width⌉`.
    #[test]
    fn the_counter_decides_by_the_exact_products_with_or_without_a_previous_weight(
        limit in 1u64..=u64::from(u32::MAX),
        width in prop_oneof![1u64..1_000, 1u64..u64::MAX / 4],
        start in 1u64..1_000_000,
        prev in prop_oneof![Just(0u64), 0u64..=u64::from(u32::MAX)],
        cur in prop_oneof![0u64..10, 0u64..=u64::from(u32::MAX)],
        into in 0u64..u64::MAX,
        c in prop_oneof![0u32..10, any::<u32>()],
    ) {
        prop_assume!(prev > 0 || cur > 0);
        let now = start + into % width;
        let rule = counter(limit, width);
        let words = [start, (prev << 32) | cur];
        let w = u128::from(width);
        let weighted = u128::from(prev) * u128::from(width - (now - start));
        let fits = u64::from(c) <= limit
            && u128::from(cur + u64::from(c)) * w + weighted <= u128::from(limit) * w;
        let step = rule.step(words, &Log::EMPTY, now, c);
        prop_assert_eq!(matches!(step, Step::Allow { .. }), fits, "{:?}", step);
        let used = u128::from(cur) + weighted.div_ceil(w);
        let remaining = u128::from(limit).saturating_sub(used) as u64;
        prop_assert_eq!(rule.state(words, &Log::EMPTY, now).remaining(), remaining);
    }

    /// A log's window holds the entries whose time is within it: the lookup that skips the
    /// search when the oldest entry counts finds what the search finds.
    #[test]
    fn a_log_counts_the_entries_of_its_window_with_or_without_a_search(
        gaps in prop::collection::vec((0u64..50, 1u64..4), 0..40),
        width in 1u64..200,
        gone in prop_oneof![Just(0u64), 0u64..2_000],
        after in 0u64..300,
    ) {
        let mut log = Log::default();
        let mut now = 1;
        let mut entries = Vec::new();
        for (gap, cost) in gaps {
            now += gap;
            log.admit(now, cost, u64::MAX / 2, u64::MAX);
            entries.push((now, cost));
        }
        let at = now + after;
        let counted: u64 = entries
            .iter()
            .filter(|(t, _)| t + width > at && *t >= gone)
            .map(|e| e.1)
            .sum();
        prop_assert_eq!(log.in_window(at, width, gone).1, counted);
    }
}

proptest! {
    /// A policy of several kinds reports each quota's figures as the quota's own state gives
    /// them after the decision (of the words kept when admitted at a cost, else of the words
    /// as they were; a log's of the log after the request), whether every quota admits, one
    /// refuses or one can never admit: the figures found with each step are those.
    #[test]
    fn each_quota_reports_its_own_state_after_a_decision_of_several_kinds(
        kinds in prop::collection::vec(0u8..5, 1..5),
        limit in 1u64..6,
        width in 1u64..500,
        reqs in run(),
        gone in prop_oneof![Just(0u64), 0u64..400],
    ) {
        let rules: Vec<Rule> = kinds
            .iter()
            .map(|&k| match k {
                3 => Rule::Gcra(Gcra::new(width.div_ceil(limit), width.div_ceil(limit) * limit)),
                4 => Rule::WarmUp(warmup::WarmGcra::new(
                    warmup::Curve::new(S, 4 * S, 2, 1_000),
                    limit * S,
                )),
                k => match kind_rule(k, limit, width) {
                    Rule::FixedWindow(w) => Rule::FixedWindow(w),
                    Rule::SlidingLog(w) => Rule::SlidingLog(Window { gone, ..w }),
                    Rule::SlidingWindow(w) => Rule::SlidingWindow(Window {
                        gone,
                        gone_cur: gone / 2,
                        ..w
                    }),
                    r => r,
                },
            })
            .collect();
        let mut st = KeyState::default();
        let mut now = 1;
        for (gap, c) in reqs {
            now += gap;
            let (d, _) = decide(&rules, &mut st, now, c);
            let own: Vec<QuotaState> = rules
                .iter()
                .enumerate()
                .map(|(i, r)| r.state(st.words[i], &st.log, now))
                .collect();
            prop_assert_eq!(d.states(), &own[..]);
        }
    }
}

/// The general rule, as the kinds define it one quota at a time: every quota's
/// [`Rule::step`] on the key's state (a log quota's on the shared log), all or nothing; when
/// admitted at a cost, each quota keeps the words its step gives and the log records the
/// request once; then each quota's [`Rule::state`] after it, and the key's idle time
/// ([`KeyState::idle_at`]). Returns the decision and the idle time.
fn general_rule(rules: &[Rule], st: &mut KeyState, now: u64, cost: u32) -> (Decision, u64) {
    let n = rules.len();
    let v = all_or_nothing(n, |i| rules[i].step(st.words[i], &st.log, now, cost));
    if v.outcome == Outcome::Allowed && cost > 0 {
        for (i, r) in rules.iter().enumerate() {
            if r.in_two_words() {
                st.words[i] = v.words[i];
            }
        }
        if let Some((width, limit)) = log_bounds(rules) {
            st.log.admit(now, u64::from(cost), width, limit);
        }
    }
    let mut quotas = [QuotaState::default(); MAX_QUOTAS];
    for (i, r) in rules.iter().enumerate() {
        quotas[i] = r.state(st.words[i], &st.log, now);
    }
    (concluded(&v, cost, quotas, n), st.idle_at_many(rules))
}

/// One step of a key's life under a policy of several quotas.
#[derive(Debug, Clone)]
enum Life {
    /// A request of this cost after this gap (ns).
    Check(u64, u32),
    /// After this gap, gives back some units of an admission (the `n`-th from the newest).
    Refund(u64, usize, u32),
    /// After this gap, settles a cost taken whatever the limit.
    Charge(u64, u32),
    /// After this gap, every quota's limit and width change live, each by its own factor
    /// (what left the old windows stays gone).
    Change(u64, u8, u8),
}

fn life() -> impl Strategy<Value = Vec<Life>> {
    let op = prop_oneof![
        6 => (0u64..300, 0u32..7).prop_map(|(g, c)| Life::Check(g, c)),
        1 => (0u64..300, 0usize..4, 1u32..4).prop_map(|(g, i, u)| Life::Refund(g, i, u)),
        1 => (0u64..300, 1u32..9).prop_map(|(g, c)| Life::Charge(g, c)),
        1 => (0u64..300, 0u8..3, 0u8..3).prop_map(|(g, a, b)| Life::Change(g, a, b)),
    ];
    prop::collection::vec(op, 1..150)
}

/// Quota `k` of a policy: a GCRA, a fixed window, a sliding counter, a sliding log or a
/// warm-up quota, its count `limit` over `width` ns (each quota of a policy its own count,
/// so that one may refuse, or never admit, what another admits).
fn life_rule(k: u8, limit: u64, width: u64) -> Rule {
    match k {
        0 => Rule::Gcra(Gcra::new(
            width.div_ceil(limit),
            width.div_ceil(limit) * limit,
        )),
        1 => fixed(limit, width),
        2 => counter(limit, width),
        3 => log(limit, width),
        _ => Rule::WarmUp(warmup::WarmGcra::new(
            warmup::Curve::new(width, 4 * width, 2, 1),
            limit * width,
        )),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    /// A policy of several kinds, decided in one pass with each quota judged by its own
    /// kind's code (the words written as it goes and put back when a later quota refuses,
    /// figures found with each step, a log's read once after the request), decides as the
    /// general rule does, through any life of a key: costs of 0 to above every limit,
    /// refunds of any earlier admission, settled charges, instants repeated or apart, and
    /// live changes of every quota's limit and width; the same decision, the same
    /// reservation, the same state after it, and the same idle time kept beside it. (A
    /// quota's kind is never changed live: `set_quotas` refuses it; every mix of kinds is
    /// drawn here.)
    #[test]
    fn one_pass_over_quotas_of_several_kinds_decides_as_the_general_rule(
        kinds in prop::collection::vec((0u8..5, 1u64..5), 2..5),
        width in 1u64..300,
        ops in life(),
    ) {
        let policy = |more: u64, width: u64| -> Vec<Rule> {
            kinds.iter().map(|&(k, limit)| life_rule(k, limit + more, width)).collect()
        };
        let mut rules = policy(0, width);
        let (mut ours, mut theirs) = (KeyState::default(), KeyState::default());
        let mut now = 1;
        let mut taken: Vec<Reservation> = Vec::new();
        for op in ops {
            match op {
                Life::Check(gap, cost) => {
                    now += gap;
                    let mut d = Decision::unlimited();
                    let (changed, idle) = decide_into(&rules, &mut ours, now, cost, &mut d);
                    let (want, want_idle) = general_rule(&rules, &mut theirs, now, cost);
                    prop_assert_eq!(d, want, "at {}", now);
                    prop_assert_eq!(Reservation::of(&d, cost), Reservation::of(&want, cost));
                    prop_assert_eq!(&ours, &theirs);
                    prop_assert_eq!(idle, want_idle);
                    prop_assert_eq!(changed, d.is_allowed() && cost > 0);
                    if changed {
                        taken.push(Reservation::of(&d, cost));
                    }
                }
                Life::Refund(gap, i, units) => {
                    now += gap;
                    if let Some(j) = taken.len().checked_sub(1 + i % taken.len().max(1)) {
                        let t = taken.remove(j);
                        ours.refund(&rules, now, &t, units);
                        theirs.refund(&rules, now, &t, units);
                    }
                }
                Life::Charge(gap, cost) => {
                    now += gap;
                    ours.charge(&rules, now, cost);
                    theirs.charge(&rules, now, cost);
                }
                Life::Change(gap, a, b) => {
                    now += gap;
                    let old = rules.clone();
                    rules = policy(u64::from(a), width * (1 + u64::from(b)) / 2 + 1);
                    Rule::replacing(&mut rules, &old, now);
                }
            }
        }
    }
}
