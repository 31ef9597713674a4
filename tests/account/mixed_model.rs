//! Policies of two to four quotas of any kinds in any order (GCRA, GCRA with warm-up of cold
//! factor 1, a fixed window, a sliding log, a sliding counter; a kind may come twice), with
//! settings of their own, decided on one key against the reference model of
//! `tests/common/account.rs`, on memory and on a real redis-server.
//!
//! Requests go to the limiter directly (their decision's figures are read at once) and
//! through the layer (held in flight, then refunded by `count_if`, kept, or settled lower or
//! higher, late: after later admissions, after refusals, after a live change of one quota's
//! limit or width); costs run from 0 to above every limit. At every step:
//! * a decision admits exactly when the model does, and reports each quota's `remaining` as
//!   the model does, admitted or refused;
//! * a refusal takes nothing: the figures read after it are those read before it;
//! * what the key holds (read without spending) is the model's.
//!
//! A warm-up quota of cold factor 1 decides as plain GCRA (its curve is flat), so the model
//! judges it as GCRA; its changes keep the warm-up period and change the rate or burst.
//!
//! Pins docs/design.md sections 1 ("Several quotas on one key", "Other kinds") and 3 ("An
//! account per key", "A live quota change").

use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use tollgate::{Decision, Quota};

use crate::common::account::rig::{manual, settles, Rig, FAILED, OK};
use crate::common::account::{Account, Kind, Taken};
use crate::common::stores::{Memory, Store};

const MS: u64 = 1_000_000;

/// The warm-up period of every warm-up quota.
const WARM: Duration = Duration::from_secs(2);

/// One quota of a policy: its kind and its two settings (GCRA: interval in ms and burst;
/// windows: limit and width in ms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pick {
    Gcra(u64, u64),
    Warm(u64, u64),
    Fixed(u64, u64),
    Log(u64, u64),
    Counter(u64, u64),
}

impl Pick {
    fn kind(self) -> Kind {
        match self {
            Pick::Gcra(i, b) | Pick::Warm(i, b) => Kind::Gcra {
                interval: i * MS,
                burst: b,
            },
            Pick::Fixed(l, w) => Kind::Fixed {
                limit: l,
                width: w * MS,
            },
            Pick::Log(l, w) => Kind::Log {
                limit: l,
                width: w * MS,
            },
            Pick::Counter(l, w) => Kind::Counter {
                limit: l,
                width: w * MS,
            },
        }
    }

    fn quota(self) -> Quota {
        match self {
            Pick::Warm(..) => self.kind().quota().warm_up(WARM, 1),
            _ => self.kind().quota(),
        }
    }

    /// The same kind with the settings `a` and `b` drawn anew.
    fn with(self, a: u64, b: u64) -> Pick {
        let (i, burst) = (GCRA_MS[a as usize % GCRA_MS.len()], 1 + b % 6);
        let (limit, width) = (1 + a % 7, WIDTH_MS[b as usize % WIDTH_MS.len()]);
        match self {
            Pick::Gcra(..) => Pick::Gcra(i, burst),
            Pick::Warm(..) => Pick::Warm(i, burst),
            Pick::Fixed(..) => Pick::Fixed(limit, width),
            Pick::Log(..) => Pick::Log(limit, width),
            Pick::Counter(..) => Pick::Counter(limit, width),
        }
    }
}

const GCRA_MS: [u64; 3] = [100, 250, 600];
const WIDTH_MS: [u64; 4] = [300, 700, 1_500, 2_500];

fn pick() -> impl Strategy<Value = Pick> {
    (0u8..5, any::<u64>(), any::<u64>()).prop_map(|(k, a, b)| {
        let p = match k {
            0 => Pick::Gcra(0, 0),
            1 => Pick::Warm(0, 0),
            2 => Pick::Fixed(0, 0),
            3 => Pick::Log(0, 0),
            _ => Pick::Counter(0, 0),
        };
        p.with(a, b)
    })
}

#[derive(Debug, Clone)]
enum Op {
    /// A request of this cost to the limiter itself.
    Check(u32),
    /// A request of this cost through the layer, held in flight when admitted.
    Send(u32),
    /// The `i`-th request in flight answers: refunded (200), kept (401) or settled at a cost.
    Answer(usize, Option<Option<u32>>),
    Wait(u64),
    /// The quota at this position takes new settings of its kind.
    Change(usize, u64, u64),
    Evict,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u32..10).prop_map(Op::Check),
        4 => (0u32..5).prop_map(Op::Send),
        4 => (0usize..8, prop::option::of(prop::option::of(0u32..10)))
            .prop_map(|(i, r)| Op::Answer(i, r)),
        3 => (0u64..900).prop_map(Op::Wait),
        2 => (0usize..4, any::<u64>(), any::<u64>()).prop_map(|(i, a, b)| Op::Change(i, a, b)),
        1 => Just(Op::Evict),
    ]
}

fn remaining(d: &Decision) -> Vec<u64> {
    d.states().iter().map(|s| s.remaining()).collect()
}

/// The ops in order on the layer and the limiter of `s`, against the model.
async fn decides_as_the_model(
    s: &impl Store,
    name: &str,
    picks: Vec<Pick>,
    ops: Vec<Op>,
) -> Result<(), TestCaseError> {
    let mut picks = picks;
    let (clock, time) = manual();
    let quotas: Vec<Quota> = picks.iter().map(|p| p.quota()).collect();
    let l = s.layer(&quotas, name, &clock);
    let lim = s.limiter(&l, name);
    let mut rig = Rig::new(|h| tower::Layer::layer(&l, h));
    let mut model = Account::new(picks.iter().map(|p| p.kind()).collect());
    let mut now = 1_000_000_000_001u64;
    let mut taken: Vec<(u64, Taken)> = Vec::new();
    for (step, op) in ops.into_iter().enumerate() {
        match op {
            Op::Check(cost) => {
                let before = s.peek(&lim, "k").await;
                let (said, _) = model.admit(now, cost);
                let d = s.check_n(&lim, "k", cost).await;
                prop_assert_eq!(
                    d.is_allowed(),
                    said.allowed,
                    "step {}: check {}",
                    step,
                    cost
                );
                prop_assert_eq!(
                    remaining(&d),
                    said.remaining,
                    "step {}: the figures of a check of {}",
                    step,
                    cost
                );
                if !d.is_allowed() {
                    let after = s.peek(&lim, "k").await;
                    prop_assert_eq!(
                        remaining(&after),
                        remaining(&before),
                        "step {}: a refusal took something",
                        step
                    );
                }
            }
            Op::Send(cost) => {
                let (said, t) = model.admit(now, cost);
                let got = rig.send("k", cost).await;
                prop_assert_eq!(got.is_some(), said.allowed, "step {}: send {}", step, cost);
                if let Some(id) = got {
                    taken.push((id, t.unwrap_or(Taken::nothing())));
                }
            }
            Op::Answer(i, reply) => {
                if taken.is_empty() {
                    continue;
                }
                let (id, t) = taken.remove(i % taken.len());
                let reply = match reply {
                    None => OK,
                    Some(None) => FAILED,
                    Some(Some(n)) => settles(n),
                };
                let actual = match (reply.status, reply.actual) {
                    (200, _) => 0,
                    (_, Some(n)) => n,
                    (_, None) => t.cost,
                };
                model.settle(now, &t, actual);
                rig.answer(id, reply).await;
            }
            Op::Wait(ms) => {
                time.advance(Duration::from_millis(ms));
                now += ms * MS;
            }
            Op::Change(i, a, b) => {
                let i = i % picks.len();
                picks[i] = picks[i].with(a, b);
                s.set_quotas(&lim, picks.iter().map(|p| p.quota()).collect());
                model.set_quotas(now, picks.iter().map(|p| p.kind()).collect());
            }
            Op::Evict => s.evict_idle(&lim),
        }
        s.keep(&lim, "k").await;
        let d = s.peek(&lim, "k").await;
        let said = model.peek(now);
        prop_assert_eq!(remaining(&d), said.remaining, "step {}: held", step);
        prop_assert_eq!(d.is_allowed(), said.allowed, "step {}: held", step);
    }
    Ok(())
}

fn policy() -> impl Strategy<Value = Vec<Pick>> {
    prop::collection::vec(pick(), 2..=4)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(Memory::CASES))]

    /// The model's property on the memory store.
    #[test]
    fn any_policy_of_mixed_kinds_decides_as_the_model_in_memory(
        picks in policy(),
        ops in prop::collection::vec(op(), 1..80),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(decides_as_the_model(&Memory, "p", picks, ops))?;
    }
}

/// The model's property on a real redis-server: one server for every case, a policy name
/// of its own per case.
#[cfg(feature = "redis")]
#[test]
fn any_policy_of_mixed_kinds_decides_as_the_model_on_redis() {
    use crate::common::stores::OnRedis;
    use proptest::test_runner::{Config, TestRunner};

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let redis = rt.block_on(OnRedis::start());
    let mut runner = TestRunner::new(Config::with_cases(OnRedis::CASES));
    let case = std::cell::Cell::new(0u32);
    let strategy = (policy(), prop::collection::vec(op(), 1..60));
    runner
        .run(&strategy, |(picks, ops)| {
            case.set(case.get() + 1);
            let name = format!("mixed{}", case.get());
            rt.block_on(async {
                let outcome = decides_as_the_model(&redis, &name, picks, ops);
                redis.judge(outcome.await).await
            })
        })
        .unwrap();
}
