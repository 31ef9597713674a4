//! The script protocol: the Lua scripts beside this file, the arguments a call sends them and
//! the replies read back into a [`Decision`].
//!
//! * **Scripts.** `prelude.lua` with `gcra.lua` decides any quotas ([`SCRIPT`]), with
//!   `gcra_only.lua` quotas that are all GCRA ([`GCRA_ONLY`]), with `plain.lua` a request
//!   or a report on quotas without warm-up ([`PLAIN`]); the same arguments, storage and
//!   replies, and [`decision_script`] chooses; `ban.lua` wraps `gcra.lua` in the penalty box
//!   ([`DECIDE`], [`DRY_DECIDE`], [`STRIKE`], [`PEEK`]).
//! * **Units.** Times and windows travel in whole microseconds ([`MICRO`] ns), numbers below
//!   2^53 (Lua doubles): [`micros`] rounds a quota to what the script can hold, or says why
//!   it cannot.
//! * **Arguments.** [`decision_args`] after the quota key; [`with_penalty_args`] after them
//!   for the penalty box.
//! * **Replies.** `{outcome, retry, remaining and reset per quota[, spots per quota]}`, or
//!   `{3, retry[, ban]}` for a ban: [`decision_of`] reads one back, checking that it fits.

use std::sync::LazyLock;
use std::time::Duration;

use ::redis::Script;

use crate::algo::gcra::Gcra;
use crate::algo::warmup::{Curve, WarmGcra};
use crate::algo::{Rule, Window};
use crate::decision::{Decision, Outcome, QuotaState, Reservation, MAX_QUOTAS};
use crate::error::ConfigError;
use crate::limiter::renews_idle_keys;
use crate::penalty::PenaltyBox;
use crate::quota::Quota;

/// The decision script, loaded once per server and called by its SHA1 (`EVALSHA`); reloaded
/// by the `redis` crate when a server answers `NOSCRIPT` (after a restart or `SCRIPT FLUSH`).
pub(super) static SCRIPT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("prelude.lua"),
        include_str!("gcra.lua")
    ))
});

/// The decision script of a policy whose quotas are all GCRA: the same arguments, storage,
/// reply and decisions as [`SCRIPT`], at a fraction of the server's time per call.
pub(super) static GCRA_ONLY: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("prelude.lua"),
        include_str!("gcra_only.lua")
    ))
});

/// The decision script of a request or a report (never a refund or a charge) on quotas
/// without warm-up: the same arguments, storage, reply and decisions as [`SCRIPT`], with
/// fewer Redis calls and at a fraction of the server's time per call.
pub(super) static PLAIN: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("prelude.lua"),
        include_str!("plain.lua")
    ))
});

/// The script for `rules`: of a request or a report, or (`adjusts`) of a refund or a charge.
pub(super) fn decision_script(rules: &[Rule], adjusts: bool) -> &'static Script {
    if rules.iter().all(|r| matches!(r, Rule::Gcra(_))) {
        &GCRA_ONLY
    } else if !adjusts && !rules.iter().any(|r| matches!(r, Rule::WarmUp(_))) {
        &PLAIN
    } else {
        &SCRIPT
    }
}

/// The quota script wrapped by the penalty box, for decisions.
pub(super) static DECIDE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("ban.lua"),
        "\nlocal function decide()\n",
        include_str!("prelude.lua"),
        include_str!("gcra.lua"),
        "\nend\nreturn penalize(decide)\n"
    ))
});

/// The quota script behind the penalty box's ban, counting no strike: the decisions of a
/// dry-run layer, whose refusals are not the key's offence (a ban recorded otherwise still
/// answers).
pub(super) static DRY_DECIDE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("ban.lua"),
        "\nlocal function decide()\n",
        include_str!("prelude.lua"),
        include_str!("gcra.lua"),
        "\nend\nreturn penalize(decide, false, true)\n"
    ))
});

/// The penalty box alone, recording one strike (as if the quotas had rejected the request).
pub(super) static STRIKE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("ban.lua"),
        "\nreturn penalize(function() return {1, 0} end)\n"
    ))
});

/// The penalty box alone, reading whether the key is banned (`{3, ban left}`) or not
/// (`{0, 0}`).
pub(super) static PEEK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("ban.lua"),
        "\nreturn penalize(function() return {0, 0} end, true)\n"
    ))
});

/// Forgets a key's penalty state.
pub(super) static PARDON: LazyLock<Script> =
    LazyLock::new(|| Script::new("redis.call('DEL', KEYS[1])\nreturn {0, 0}\n"));

/// The largest time sent to the script, in microseconds (about 35 years): sums of two stay
/// exact in Lua's doubles.
pub(super) const MAX_MICROS: u64 = 1 << 50;

/// One argument of the script.
#[derive(Clone, Copy)]
pub(super) enum Arg<'a> {
    Int(u64),
    Bytes(&'a [u8]),
}

/// The time argument of a call: the limiter's clock's `now` when it sends its own time (a
/// test clock), else empty (the script reads the server's `TIME`).
pub(super) fn time_arg<'a>(local_time: bool, now: u64) -> Arg<'a> {
    if local_time {
        Arg::Int(now / MICRO)
    } else {
        Arg::Bytes(b"")
    }
}

pub(super) const MICRO: u64 = 1_000;

/// The largest integer the script's numbers (Lua doubles) hold exactly.
const EXACT: u128 = 1 << 53;

/// A quota in whole microseconds (an interval or a window rounded up), in nanoseconds.
pub(super) fn micros(q: &Quota) -> Result<Rule, ConfigError> {
    let window = |w: &Window, counter: bool| -> Result<Window, ConfigError> {
        let width = w.width.div_ceil(MICRO);
        // The counter multiplies counts (up to twice the limit) by widths in the script.
        if counter && u128::from(w.limit) * u128::from(width) * 2 >= EXACT {
            return Err(ConfigError::WindowTooLongForStore {
                count: q.count(),
                window: q.period(),
            });
        }
        Ok(Window::new(w.limit, width * MICRO))
    };
    match q.rule() {
        Rule::Gcra(_) => gcra_micros(q).map(Rule::Gcra),
        Rule::FixedWindow(w) => window(&w, false).map(Rule::FixedWindow),
        Rule::SlidingLog(w) => window(&w, false).map(Rule::SlidingLog),
        Rule::SlidingWindow(w) => window(&w, true).map(Rule::SlidingWindow),
        Rule::WarmUp(_) => {
            let g = gcra_micros(q)?;
            // The script computes the curve in whole microseconds: the period is rounded down
            // to one (at least 1 µs).
            let w = q.warm_up_settings().ok_or(ConfigError::WarmUpOnWindow)?;
            let period = (w.period().as_nanos() / u128::from(MICRO)).max(1) as u64;
            let curve = Curve::new(g.interval, period * MICRO, w.cold_factor(), MICRO);
            Ok(Rule::WarmUp(WarmGcra::new(curve, g.tolerance)))
        }
    }
}

/// A GCRA quota in whole microseconds (interval rounded up), expressed in nanoseconds.
fn gcra_micros(q: &Quota) -> Result<Gcra, ConfigError> {
    let g = q.gcra();
    let too_fine = ConfigError::RateTooHighForStore {
        count: q.count(),
        period: q.period(),
        resolution: Duration::from_micros(1),
    };
    let period = q.period().as_nanos();
    if period < u128::from(q.count()) * u128::from(MICRO) {
        return Err(too_fine);
    }
    let interval = g.interval.div_ceil(MICRO) * MICRO;
    let tolerance = interval
        .checked_mul(u64::from(q.burst_size()))
        .filter(|t| *t <= u64::MAX / 4)
        .ok_or(ConfigError::ToleranceTooLong)?;
    Ok(Gcra::new(interval, tolerance))
}

/// A quota's kind and two numbers, as the script takes them (GCRA: interval and tolerance in
/// microseconds; a window: its count and width in microseconds; warm-up: as GCRA).
pub(super) fn rule_args(r: &Rule) -> (u64, u64, u64) {
    match r {
        Rule::Gcra(g) => (0, g.interval / MICRO, g.tolerance / MICRO),
        Rule::FixedWindow(w) => (1, w.limit, w.width / MICRO),
        Rule::SlidingLog(w) => (2, w.limit, w.width / MICRO),
        Rule::SlidingWindow(w) => (3, w.limit, w.width / MICRO),
        Rule::WarmUp(g) => (4, g.curve.interval / MICRO, g.tolerance / MICRO),
    }
}

/// A live change of a limit that changed a warm-up curve: a key idle at that instant under
/// the quotas then in force is a new key, as the memory store makes it (see
/// [`RateLimiter::set_quotas`](crate::RateLimiter::set_quotas)), whatever time to live Redis
/// still gives it (its expiry is rounded up to whole milliseconds, and a walk after the change
/// may have lengthened it).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Renewal {
    /// When, in whole microseconds (rounded down: a key idle at a microsecond is idle at
    /// every later instant of it).
    at: u64,
    /// Each warm-up quota's curve before the change, in order: its period in microseconds and
    /// its cold factor.
    curves: Box<[(u64, u64)]>,
    /// Each sliding window's or log's width before the change and what had left its windows
    /// then, in order, in microseconds: a key's idle time under them depends on those.
    windows: Box<[(u64, u64, u64)]>,
    /// The longest warm-up period (µs) of the quotas in force since: a key idle at the change
    /// has regained its deficit under any of them that long after, so once that time is past
    /// at a later change, whatever this renewal would make new is idle under the quotas in
    /// force, and it is dropped.
    span: u64,
}

/// The changes of warm-up curves a key stored before may still have to be judged by, oldest
/// first: at most [`MAX_RENEWALS`] (more changes of curve within one warm-up period drop the
/// oldest).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Renewals(Box<[Renewal]>);

/// The most changes of curve the script is told of.
const MAX_RENEWALS: usize = 4;

/// The longest warm-up period of `rules`, in microseconds.
fn warm_span(rules: &[Rule]) -> u64 {
    rules
        .iter()
        .filter_map(|r| match r {
            Rule::WarmUp(g) => Some(g.curve.period),
            _ => None,
        })
        .max()
        .unwrap_or(0)
}

impl Renewals {
    /// The renewals in force once `new` replaces `old` at `now` (ns), `self` being those in
    /// force before: one more when a warm-up curve changes.
    pub(super) fn after(&self, old: &[Rule], new: &[Rule], now: u64) -> Renewals {
        let at = now / MICRO;
        let span = warm_span(old).max(warm_span(new));
        let mut list: Vec<Renewal> = self
            .0
            .iter()
            .map(|r| Renewal {
                span: r.span.max(span),
                ..r.clone()
            })
            .filter(|r| at < r.at.saturating_add(r.span))
            .collect();
        // One more when the memory store would make the keys idle at this change new.
        if renews_idle_keys(old, new) {
            let curves = old
                .iter()
                .filter_map(|r| match r {
                    Rule::WarmUp(g) => Some((g.curve.period, g.curve.cold_factor)),
                    _ => None,
                })
                .collect();
            let windows = old
                .iter()
                .filter_map(|r| match r {
                    Rule::SlidingLog(w) | Rule::SlidingWindow(w) => Some((
                        w.width / MICRO,
                        w.gone.div_ceil(MICRO),
                        w.gone_cur.div_ceil(MICRO),
                    )),
                    _ => None,
                })
                .collect();
            list.push(Renewal {
                at,
                curves,
                windows,
                span,
            });
            if list.len() > MAX_RENEWALS {
                list.remove(0);
            }
        }
        Renewals(list.into())
    }
}

/// The decision script's arguments after the key: the cost (negative for a refund), the
/// time sent ([`time_arg`]), then each quota's kind and two numbers (GCRA: interval and
/// tolerance in microseconds; a window: its count and width in microseconds; warm-up: as
/// GCRA), then the cost of the reservation `taken` that a refund gives back from (0:
/// none), then for each warm-up quota in order its period in microseconds and its cold
/// factor, then for each quota what had left its windows at changes of quotas (see
/// `Window::replacing`), then `taken`'s spots (as the script gave them, see [`decision_of`]),
/// then, after changes of a warm-up curve, how many [`Renewals`] and for each its time,
/// each warm-up quota's period and cold factor before it, and each sliding window's or log's
/// width and gone times before it.
///
/// Only what the call needs is sent: without a reservation or a renewal, not the zeros that
/// end the arguments after the quotas' numbers and warm-up settings, which the scripts read
/// as 0 (each one sent costs the server about a thousand instructions); without a renewal,
/// no room for one. The list has room for the penalty box's arguments after it
/// ([`with_penalty_args`]).
pub(super) fn decision_args<'a>(
    rules: &[Rule],
    renewals: &Renewals,
    cost: Arg<'a>,
    time: Arg<'a>,
    taken: Option<&Reservation>,
) -> Vec<Arg<'a>> {
    let renewed = if renewals.0.is_empty() {
        0
    } else {
        let each = |r: &Renewal| 1 + 2 * r.curves.len() + 3 * r.windows.len();
        1 + renewals.0.iter().map(each).sum::<usize>()
    };
    let mut args = Vec::with_capacity(4 + 9 * rules.len() + renewed + PENALTY_ARGS);
    args.extend([cost, time, Arg::Int(rules.len() as u64)]);
    for r in rules {
        let (kind, a, b) = rule_args(r);
        args.extend([Arg::Int(kind), Arg::Int(a), Arg::Int(b)]);
    }
    args.push(Arg::Int(taken.map_or(0, |t| u64::from(t.cost))));
    for r in rules {
        if let Rule::WarmUp(g) = r {
            args.extend([Arg::Int(g.curve.period), Arg::Int(g.curve.cold_factor)]);
        }
    }
    // What a warm-up quota's settings end, read by position: never left out.
    let settings = args.len();
    for r in rules {
        let (gone, gone_cur) = match r {
            Rule::SlidingLog(w) | Rule::SlidingWindow(w) => (w.gone, w.gone_cur),
            _ => (0, 0),
        };
        // Exclusive bounds: rounded up, they keep the same whole microseconds.
        args.extend([
            Arg::Int(gone.div_ceil(MICRO)),
            Arg::Int(gone_cur.div_ceil(MICRO)),
        ]);
    }
    if let Some(t) = taken.filter(|t| t.cost > 0) {
        // Kept one above the script's numbers (see `decision_of`).
        for spot in &t.spots[..rules.len()] {
            args.extend([
                Arg::Int(spot[0].saturating_sub(1)),
                Arg::Int(spot[1].saturating_sub(1)),
            ]);
        }
    } else if renewed > 0 {
        // The spots' place is kept (zeros) for the renewal after them.
        args.resize(args.len() + 2 * rules.len(), Arg::Int(0));
    } else {
        // The zeros that end a request's arguments (no reservation, nothing gone) are not
        // sent: every script reads a missing one as 0.
        let keep = if settings > 4 + 3 * rules.len() {
            settings
        } else {
            3 + 3 * rules.len()
        };
        while args.len() > keep && matches!(args.last(), Some(Arg::Int(0))) {
            args.pop();
        }
    }
    if renewed > 0 {
        args.push(Arg::Int(renewals.0.len() as u64));
        for r in &renewals.0 {
            args.push(Arg::Int(r.at));
            for &(period, cold_factor) in &r.curves {
                args.extend([Arg::Int(period), Arg::Int(cold_factor)]);
            }
            for &(width, gone, gone_cur) in &r.windows {
                args.extend([Arg::Int(width), Arg::Int(gone), Arg::Int(gone_cur)]);
            }
        }
    }
    args
}

/// How many arguments the penalty box adds after a decision's ([`with_penalty_args`]).
const PENALTY_ARGS: usize = 6;

/// The arguments of a report (to [`SCRIPT`]) that lengthens a key's expiry to when it is idle
/// under `rules`, never shortening it (see `expiry.rs`): a request's of cost 0, with `"~"`
/// where a refund's reservation goes.
pub(super) fn lengthening_args<'a>(
    rules: &[Rule],
    renewals: &Renewals,
    time: Arg<'a>,
) -> Vec<Arg<'a>> {
    let mut args = decision_args(rules, renewals, Arg::Int(0), time, None);
    let at = 3 + 3 * rules.len();
    if args.len() <= at {
        args.resize(at + 1, Arg::Int(0));
    }
    args[at] = Arg::Bytes(b"~");
    args
}

/// The script arguments of a penalty box's rules, in microseconds (at most [`MAX_MICROS`]).
pub(super) fn penalty_rules(p: &PenaltyBox) -> [u64; 5] {
    let r = p.rules();
    let us = |ns: u64| (ns.div_ceil(MICRO)).clamp(1, MAX_MICROS);
    [
        u64::from(r.strikes),
        us(r.within),
        us(r.ban),
        us(r.max_ban),
        us(r.forget_after).max(1),
    ]
}

/// `args` followed by the penalty box's: the time ([`time_arg`]), then its `rules` (see
/// [`penalty_rules`]).
pub(super) fn with_penalty_args<'a>(
    rules: &[u64; 5],
    mut args: Vec<Arg<'a>>,
    time: Arg<'a>,
) -> Vec<Arg<'a>> {
    args.reserve(PENALTY_ARGS);
    args.push(time);
    args.extend(rules.iter().map(|&r| Arg::Int(r)));
    args
}

/// The time until the ban of a banned reply (`{3, wait, ban}`) ends, in ns.
pub(super) fn ban_left(r: &[i64]) -> Option<u64> {
    match r {
        [3, _, ban] => u64::try_from(*ban).ok()?.checked_mul(MICRO),
        _ => None,
    }
}

/// Maps the script's reply onto a decision under `rules`; `None` when it does not fit.
pub(super) fn decision_of(rules: &[Rule], r: &[i64], cost: u32) -> Option<Decision> {
    if let [3, left] | [3, left, _] = r {
        let left = u64::try_from(*left).ok()?.checked_mul(MICRO)?;
        return Some(Decision::banned(rules, left));
    }
    let n = rules.len();
    // An admission of a cost adds what it took: each quota's spot, kept one above the
    // script's numbers, so that a reservation the script filled in is never one it did not
    // (`Reservation::none()`'s zeros), even when its every spot is at 0 µs (a log entry or a
    // counter's window at the first instant of a test clock); `decision_args` sends it back
    // one below.
    let mut taken = Reservation::none();
    if r.len() == 2 + 4 * n && r[0] == 0 && cost > 0 {
        taken.cost = cost;
        let spot = |v: i64| u64::try_from(v).ok()?.checked_add(1);
        for (i, s) in taken.spots[..n].iter_mut().enumerate() {
            *s = [spot(r[2 + 2 * n + 2 * i])?, spot(r[3 + 2 * n + 2 * i])?];
        }
    } else if r.len() != 2 + 2 * n {
        return None;
    }
    let outcome = match r[0] {
        0 => Outcome::Allowed,
        1 => Outcome::Limited,
        2 => Outcome::Exceeds,
        _ => return None,
    };
    let ns = |v: i64| u64::try_from(v).ok()?.checked_mul(MICRO);
    let mut quotas = [QuotaState::default(); MAX_QUOTAS];
    for (i, rule) in rules.iter().enumerate() {
        let remaining = u64::try_from(r[2 + 2 * i]).ok()?;
        let reset = ns(r[3 + 2 * i])?;
        quotas[i] = match rule {
            Rule::Gcra(g) => {
                // The script's `remaining` follows from the time ahead; keep its
                // consistency check.
                let state = QuotaState::ahead_by(g, reset);
                if state.remaining() != remaining {
                    return None;
                }
                state
            }
            Rule::FixedWindow(w) | Rule::SlidingLog(w) | Rule::SlidingWindow(w) => {
                if remaining > w.limit {
                    return None;
                }
                QuotaState::counted(w.limit, remaining, reset)
            }
            Rule::WarmUp(g) => {
                if remaining > g.burst() {
                    return None;
                }
                QuotaState::counted(g.burst(), remaining, reset)
            }
        };
    }
    let d = Decision::from_store(outcome, ns(r[1])?, &quotas[..rules.len().min(MAX_QUOTAS)]);
    Some(d.with_taken(taken))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::QuotaKind;
    use std::time::Duration;

    fn rules(burst: u32, period_s: u64) -> Vec<Rule> {
        let q = Quota::per_second(1)
            .burst(burst)
            .warm_up(Duration::from_secs(period_s), 3);
        vec![micros(&q).unwrap()]
    }

    const S: u64 = 1_000_000_000;

    #[test]
    fn renewals_follow_changes_of_curve_and_go_once_a_warm_up_period_has_passed() {
        let none = Renewals::default();
        // A change of burst alone renews nothing, and keeps what is in force.
        assert_eq!(none.after(&rules(1, 4), &rules(2, 4), 10 * S), none);
        let one = none.after(&rules(1, 4), &rules(1, 8), 10 * S);
        assert_eq!(one.0.len(), 1);
        assert_eq!(one.0[0].at, 10_000_000);
        assert_eq!(&*one.0[0].curves, &[(4_000_000, 3)]);
        assert_eq!(one.0[0].span, 8_000_000);
        assert_eq!(one.after(&rules(1, 8), &rules(2, 8), 12 * S), one);
        // Within the longest period since (8 s), every change is kept, up to four.
        let mut r = one.clone();
        for (i, p) in [2u64, 8, 2, 8].into_iter().enumerate() {
            let from = if i % 2 == 0 { 8 } else { 2 };
            r = r.after(&rules(1, from), &rules(1, p), (11 + i as u64) * S);
        }
        assert_eq!(r.0.len(), MAX_RENEWALS);
        assert_eq!(r.0[0].at, 11_000_000, "the oldest went");
        // 8 s after the last of them, at a change of burst, none is needed any more.
        assert_eq!(
            r.after(&rules(1, 8), &rules(2, 8), 22 * S).0.len(),
            0,
            "every key idle at those changes is idle under any curve since"
        );
    }

    /// An argument as the server reads it.
    fn text(a: &Arg<'_>) -> String {
        match a {
            Arg::Int(n) => n.to_string(),
            Arg::Bytes(b) => String::from_utf8_lossy(b).into_owned(),
        }
    }

    /// Every argument of a call in its place, zeros included, as the scripts lay them out
    /// (gcra.lua's header; the renewals' count once there are any): the reference the
    /// arguments sent are held to.
    fn whole(rules: &[Rule], renewals: &Renewals, taken: Option<&Reservation>) -> Vec<String> {
        let mut v = vec!["3".to_owned(), "7".to_owned(), rules.len().to_string()];
        for r in rules {
            let (k, a, b) = rule_args(r);
            v.extend([k, a, b].map(|x| x.to_string()));
        }
        v.push(taken.map_or(0, |t| t.cost).to_string());
        for r in rules {
            if let Rule::WarmUp(g) = r {
                v.extend([g.curve.period, g.curve.cold_factor].map(|x| x.to_string()));
            }
        }
        for r in rules {
            let (g, c) = match r {
                Rule::SlidingLog(w) | Rule::SlidingWindow(w) => (w.gone, w.gone_cur),
                _ => (0, 0),
            };
            v.extend([g.div_ceil(MICRO), c.div_ceil(MICRO)].map(|x| x.to_string()));
        }
        for q in 0..rules.len() {
            let spot = taken.filter(|t| t.cost > 0).map_or([1, 1], |t| t.spots[q]);
            v.extend(spot.map(|x| x.saturating_sub(1).to_string()));
        }
        if !renewals.0.is_empty() {
            v.push(renewals.0.len().to_string());
        }
        for r in &renewals.0 {
            v.push(r.at.to_string());
            v.extend(
                r.curves
                    .iter()
                    .flat_map(|&(p, c)| [p, c])
                    .map(|x| x.to_string()),
            );
            let windows = r.windows.iter().flat_map(|&(w, g, c)| [w, g, c]);
            v.extend(windows.map(|x| x.to_string()));
        }
        v
    }

    #[test]
    fn the_arguments_sent_are_the_whole_layout_less_only_its_ending_zeros() {
        let second = Duration::from_secs(1);
        let warm = || Quota::per_second(2).warm_up(3 * second, 3);
        let policies: Vec<Vec<Quota>> = vec![
            vec![Quota::per_second(5)],
            vec![Quota::fixed_window(5, second)],
            vec![Quota::sliding_log(5, second)],
            vec![Quota::sliding_window(5, second)],
            vec![warm()],
            vec![warm(), Quota::sliding_log(5, second)],
            vec![
                Quota::per_second(5),
                Quota::fixed_window(5, second),
                Quota::sliding_log(5, second),
                warm(),
            ],
        ];
        let mut taken = Reservation::none();
        taken.cost = 2;
        taken.spots = [[9, 11], [12, 14], [15, 1], [20, 30]];
        for quotas in policies {
            let before: Vec<Rule> = quotas.iter().map(|q| micros(q).unwrap()).collect();
            // The same kinds, windows narrowed at 5 s (something gone) and a curve changed.
            let mut after: Vec<Rule> = quotas
                .iter()
                .map(|q| match q.kind() {
                    QuotaKind::SlidingLog => Quota::sliding_log(5, second / 2),
                    QuotaKind::SlidingWindow => Quota::sliding_window(5, second / 2),
                    QuotaKind::WarmUp => Quota::per_second(2).warm_up(second, 3),
                    _ => q.clone(),
                })
                .map(|q| micros(&q).unwrap())
                .collect();
            Rule::replacing(&mut after, &before, 5 * S);
            let renewed = Renewals::default().after(&before, &after, 5 * S);
            for (rules, renewals) in [
                (&before, Renewals::default()),
                (&after, Renewals::default()),
                (&after, renewed),
            ] {
                for taken in [None, Some(&taken)] {
                    let args = decision_args(rules, &renewals, Arg::Int(3), Arg::Int(7), taken);
                    assert!(args.capacity() >= args.len() + PENALTY_ARGS, "{quotas:?}");
                    let sent: Vec<String> = args.iter().map(text).collect();
                    let all = whole(rules, &renewals, taken);
                    if taken.is_some() || !renewals.0.is_empty() {
                        assert_eq!(sent, all, "{quotas:?}");
                        continue;
                    }
                    // Whatever is left out is a zero at the end, never a quota's number or
                    // a warm-up setting; what ends the list sent is not a zero.
                    assert_eq!(sent[..], all[..sent.len()], "{quotas:?}");
                    assert!(all[sent.len()..].iter().all(|a| a == "0"), "{quotas:?}");
                    let warm_settings = 2 * rules
                        .iter()
                        .filter(|r| matches!(r, Rule::WarmUp(_)))
                        .count();
                    let floor = 3 + 3 * rules.len() + (warm_settings > 0) as usize;
                    assert!(sent.len() >= floor + warm_settings, "{quotas:?}");
                    if sent.len() > floor {
                        assert_ne!(sent.last().unwrap(), "0", "{quotas:?}");
                    }
                }
            }
        }
    }
}
