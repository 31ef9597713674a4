//! Many limiters taking turns on one thread: each thread keeps the last few sets of quotas it
//! decided with, of any limiters, and finds a set by the number of the set in force. Six
//! limiters (more than a thread keeps) of every shape (one GCRA quota, several, one window
//! quota, a sliding log alone, mixed kinds; keyed and on the one key of `()`) take turns;
//! their quotas change on this thread and on another one between two checks here, and
//! limiters are dropped and made again (new sets, after others were dropped). Every check
//! decides with its own limiter's quotas in force: the figures (limit and remaining of each
//! quota) and the outcome are those of the reference model of that limiter alone.
//!
//! Pins docs/design.md section 1 (every kind fills the same `Decision`) and section 3 ("A
//! live quota change": a change applies from the next decision on, to every clone).

use std::time::Duration;

use proptest::prelude::*;
use tollgate::{Clock, Decision, ManualClock, Quota, RateLimiter};

use crate::common::account::{Account, Kind};

const MS: u64 = 1_000_000;

/// The limiters of the round, each a shape of its own.
const LIMITERS: usize = 6;

/// Limiter `i`'s quotas of setting `s`: the same kinds, other numbers (each setting gives
/// every quota of every limiter a limit of its own, so that a check decided with another
/// limiter's set or an old set reports another limit).
fn kinds(i: usize, s: u64) -> Vec<Kind> {
    let n = 2 + s % 5;
    let (lim, w) = (n + i as u64, (300 + 200 * (s % 3)) * MS);
    let gcra = Kind::Gcra {
        interval: (100 + 50 * (s % 4)) * MS,
        burst: lim,
    };
    match i {
        0 => vec![gcra],
        1 => vec![
            gcra,
            Kind::Gcra {
                interval: 40 * MS,
                burst: lim + 1,
            },
        ],
        2 => vec![Kind::Fixed {
            limit: lim,
            width: w,
        }],
        3 => vec![Kind::Log {
            limit: lim,
            width: w,
        }],
        4 => vec![
            Kind::Log {
                limit: lim,
                width: w,
            },
            Kind::Counter {
                limit: lim + 1,
                width: 2 * w,
            },
            gcra,
        ],
        _ => vec![
            Kind::Fixed {
                limit: lim,
                width: w,
            },
            Kind::Log {
                limit: lim + 2,
                width: w / 2,
            },
        ],
    }
}

fn quotas(kinds: &[Kind]) -> Vec<Quota> {
    kinds.iter().map(Kind::quota).collect()
}

/// A limiter keyed by `u8`, or of the one key of `()`.
enum Limiter {
    Keyed(RateLimiter<u8>),
    One(RateLimiter<()>),
}

impl Limiter {
    fn build(kinds: &[Kind], clock: &Clock, one: bool) -> Self {
        let q = quotas(kinds);
        if one {
            let b = RateLimiter::<()>::builder(q[0].clone()).clock(clock.clone());
            Limiter::One(q[1..].iter().fold(b, |b, q| b.quota(q.clone())).build())
        } else {
            let b = RateLimiter::<u8>::builder(q[0].clone()).clock(clock.clone());
            Limiter::Keyed(q[1..].iter().fold(b, |b, q| b.quota(q.clone())).build())
        }
    }

    fn check_n(&self, cost: u32) -> Decision {
        match self {
            Limiter::Keyed(l) => l.check_n(&7, cost),
            Limiter::One(l) => l.check_n(&(), cost),
        }
    }

    fn set(&self, kinds: &[Kind]) {
        match self {
            Limiter::Keyed(l) => l.set_quotas(quotas(kinds)).unwrap(),
            Limiter::One(l) => l.set_quotas(quotas(kinds)).unwrap(),
        }
    }

    /// A clone, sent to another thread to change the quotas there.
    fn clone_to(&self) -> Limiter {
        match self {
            Limiter::Keyed(l) => Limiter::Keyed(l.clone()),
            Limiter::One(l) => Limiter::One(l.clone()),
        }
    }
}

struct Round {
    clock: Clock,
    time: ManualClock,
    now: u64,
    limiters: Vec<(Limiter, Account, u64)>,
}

#[derive(Debug, Clone)]
enum Op {
    /// A check of this cost on limiter `i`.
    Check(usize, u32),
    /// Limiter `i` takes setting `s`, changed here or on another thread.
    Change(usize, u64, bool),
    /// Limiter `i` is dropped and made again with setting `s`, keyed or of `()`.
    Remake(usize, u64, bool),
    Wait(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..LIMITERS, 0u32..4).prop_map(|(i, c)| Op::Check(i, c)),
        3 => (0..LIMITERS, any::<u64>(), any::<bool>()).prop_map(|(i, s, t)| Op::Change(i, s, t)),
        1 => (0..LIMITERS, any::<u64>(), any::<bool>()).prop_map(|(i, s, o)| Op::Remake(i, s, o)),
        2 => (0u64..400).prop_map(Op::Wait),
    ]
}

fn figures(d: &Decision) -> Vec<(u64, u64)> {
    d.states()
        .iter()
        .map(|s| (s.limit(), s.remaining()))
        .collect()
}

/// What the model says a check of `cost` reports: (limit, remaining) per quota.
fn said(model: &mut Account, now: u64, cost: u32) -> (bool, Vec<(u64, u64)>) {
    let limits: Vec<u64> = model
        .quotas
        .iter()
        .map(|k| match *k {
            Kind::Gcra { burst, .. } => burst,
            Kind::Fixed { limit, .. } | Kind::Log { limit, .. } | Kind::Counter { limit, .. } => {
                limit
            }
        })
        .collect();
    let (said, _) = model.admit(now, cost);
    (
        said.allowed,
        limits.into_iter().zip(said.remaining).collect(),
    )
}

impl Round {
    fn new() -> Self {
        let (clock, time) = Clock::manual();
        time.advance(Duration::from_secs(1_000));
        let limiters = (0..LIMITERS)
            .map(|i| {
                let k = kinds(i, 0);
                (Limiter::build(&k, &clock, i % 2 == 1), Account::new(k), 0)
            })
            .collect();
        Round {
            clock,
            time,
            now: 1_000_000_000_000,
            limiters,
        }
    }

    fn run(&mut self, op: Op) -> Result<(), TestCaseError> {
        match op {
            Op::Check(i, cost) => {
                let (l, model, s) = &mut self.limiters[i];
                let d = l.check_n(cost);
                let (allowed, figures_said) = said(model, self.now, cost);
                prop_assert_eq!(
                    (d.is_allowed(), figures(&d)),
                    (allowed, figures_said),
                    "limiter {} at setting {}, cost {}",
                    i,
                    s,
                    cost
                );
            }
            Op::Change(i, s, elsewhere) => {
                let (l, model, at) = &mut self.limiters[i];
                let k = kinds(i, s);
                if elsewhere {
                    let other = l.clone_to();
                    let k2 = k.clone();
                    std::thread::spawn(move || other.set(&k2)).join().unwrap();
                } else {
                    l.set(&k);
                }
                model.set_quotas(self.now, k);
                *at = s;
            }
            Op::Remake(i, s, one) => {
                let k = kinds(i, s);
                self.limiters[i] = (Limiter::build(&k, &self.clock, one), Account::new(k), s);
            }
            Op::Wait(ms) => {
                self.time.advance(Duration::from_millis(ms));
                self.now += ms * MS;
            }
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Six limiters of every shape taking turns on one thread, changed here and elsewhere,
    /// dropped and made again: every check decides as its own limiter's model.
    #[test]
    fn each_check_decides_with_its_own_limiters_quotas_in_force_among_many_on_one_thread(
        ops in prop::collection::vec(op(), 1..120),
    ) {
        let mut round = Round::new();
        for op in ops {
            round.run(op)?;
        }
    }
}

/// Two limiters of one shape and the same kinds, their sets made one after the other, and a
/// change of the first from another thread between two of its checks here, while the
/// second's set (which this thread keeps) has the first's old numbers.
#[test]
fn a_change_made_on_another_thread_is_in_force_at_the_next_check_here_beside_a_twin() {
    let (clock, _time) = Clock::manual();
    let log = |n| {
        vec![
            Quota::sliding_log(n, Duration::from_secs(1)),
            Quota::fixed_window(n + 10, Duration::from_secs(1)),
        ]
    };
    let build = |q: Vec<Quota>| {
        RateLimiter::<u8>::builder(q[0].clone())
            .quota(q[1].clone())
            .clock(clock.clone())
            .build()
    };
    let a = build(log(3));
    let b = build(log(3));
    for round in 0..6u32 {
        assert_eq!(a.check_n(&1, 0).states()[0].limit(), u64::from(3 + round));
        assert_eq!(b.check_n(&1, 0).states()[0].limit(), 3);
        let other = a.clone();
        std::thread::spawn(move || other.set_quotas(log(4 + round)).unwrap())
            .join()
            .unwrap();
        assert_eq!(a.check_n(&1, 0).states()[0].limit(), u64::from(4 + round));
        assert_eq!(a.check_n(&1, 0).states()[1].limit(), u64::from(14 + round));
    }
}
