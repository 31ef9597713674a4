//! Limits that learn from the response: count only the responses that match, or charge the
//! cost the response reports.
//!
//! A [`RateLimitLayer`](super::RateLimitLayer) with [`count_if`](super::RateLimitLayer::count_if)
//! or [`settle`](super::RateLimitLayer::settle) decides in two steps:
//!
//! 1. **Reserve, before the handler.** The request's cost (from
//!    [`cost`](super::RateLimitLayer::cost), 1 by default) is decided as usual: a key already
//!    over its limit is rejected at once, and the handler is not called. An admitted request
//!    *holds* its cost while the handler runs, so parallel requests of one key cannot all slip
//!    through: with a limit of 5 and 100 wrong passwords sent at once, at most 5 reach the
//!    handler, whatever the responses turn out to be.
//! 2. **Settle, when the response head comes back** (status, header fields, extensions). The
//!    actual cost is the reserved cost, or 0 when `count_if` says the response does not count,
//!    or what `settle` reads from the response. A smaller actual cost gives the difference
//!    back from what the request took (see [below](#what-a-refund-gives-back)); a
//!    larger one charges the difference **even over the limit**: the key goes into debt, and
//!    its next requests are rejected, with a true `Retry-After`, until the debt is paid off
//!    by time (even a request of cost 0, which asks for nothing but must not pass a key in
//!    debt unseen). Equal: nothing to do.
//!
//! The settlement is done before the response is returned (in memory at once; on Redis one
//! script call, whose round trip the response waits for), so the next request of the key, sent
//! after this response arrived, sees the settled state. The `RateLimit` header fields of the
//! response report the state **after settling** when the cost changed (the client learns what
//! the request really cost it), and the state after the reservation otherwise. The
//! [`Decision`](crate::Decision) the handler finds in its request's extensions is the one of
//! the reservation.
//!
//! # What a refund gives back
//!
//! An admission remembers what it took and where: for GCRA and warm-up, the slice of time it
//! added to the key's theoretical arrival time (measured with the quota in force then); for a
//! fixed window or a sliding-window counter, the window it was counted in; for a sliding log,
//! its own entry. A refund (a layer inside rejected the request) or a smaller settled cost
//! gives back exactly that, and only the part that still counts when it arrives:
//!
//! * nothing once the request's window has passed (it no longer counts anywhere);
//! * a log entry gives back its own units, never another request's;
//! * GCRA gives back the end part of its own slice that is still ahead of now, never moving
//!   the key's time before now, sized by the interval of its admission (a rate lowered
//!   meanwhile does not make it worth more).
//!
//! So a late refund never doubles a limit, and a refund never grants more than the request
//! took. A larger settled cost is charged now, as a debt that stands, and costs a key no
//! more bytes than a small one: GCRA's debt is its time, a window's its count, and a sliding
//! log records the charge whole, as one entry, so a count raised live later still finds the
//! debt in the window.
//!
//! # What settles, and what does not
//!
//! * Settled once, from the response head. What a body sends afterwards (a trailer, a counter
//!   it updates) is not read: report the cost in the head (a header field, or an
//!   [`ActualCost`] extension), as the handler knows it when it returns.
//! * **A response that never comes leaves the reservation charged**: the handler panicked (and
//!   no layer inside turned the panic into a response), the client went away and the request
//!   was cancelled, a timeout outside dropped the future. Nothing is given back, nothing more
//!   is taken, and nothing can be given back twice. For brute-force protection this is the
//!   safe side: a client cannot hang up before the answer to escape counting. A panic turned
//!   into a `500` response inside the layer (tower-http's `CatchPanicLayer`) is a response
//!   like any other, settled by the rules.
//! * A body dropped mid-way changes nothing: the settlement was made from the head.
//! * A rejection by a layer of this crate inside gives the whole reservation back, as for any
//!   stacked layer (see [the module docs](super#stacked-limits-are-all-or-nothing)); the
//!   settle rules are not asked.
//! * On Redis, a settlement that Redis does not answer within the store's timeout is logged
//!   as an outage and not retried: the response carries the header fields of the
//!   reservation, and the key is settled once (the script had reached Redis) or not at all
//!   (the reservation stands). A request admitted while Redis is down (failing open)
//!   reserved nothing and settles nothing; one admitted by the local fallback
//!   (`FailMode::Local`) reserved from the fallback's state, and is settled (or given back)
//!   there, at once, even if Redis is back by then.
//! * In dry-run mode an admitted request reserves and settles as when enforced; a would-be
//!   rejection let through reserved nothing and settles nothing. A settlement is not counted
//!   as a decision: see [the observe docs](crate::observe#settling-after-the-response).

use std::sync::Arc;

use http::header::HeaderName;
use http::response::Parts;

/// Whether a response counts.
pub(crate) type CountFn = dyn Fn(&Parts) -> bool + Send + Sync;
/// The actual cost a response reports, if it reports one.
pub(crate) type AmountFn = dyn Fn(&Parts) -> Option<u32> + Send + Sync;

/// The actual cost of a response, set by the handler in the response's extensions; read by a
/// layer whose [`settle`](super::RateLimitLayer::settle) rule is [`ActualCost::of`].
///
/// ```
/// use axum::response::IntoResponse;
/// use tollgate::rate_limit::settle::ActualCost;
///
/// async fn complete() -> impl IntoResponse {
///     let tokens_used = 1234; // known once the work is done
///     let mut response = "…completion…".into_response();
///     response.extensions_mut().insert(ActualCost(tokens_used));
///     response
/// }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ActualCost(pub u32);

impl ActualCost {
    /// The cost a handler put in the response's extensions, if any: a settle rule,
    /// `.settle(ActualCost::of)`.
    pub fn of(response: &Parts) -> Option<u32> {
        response.extensions.get::<ActualCost>().map(|c| c.0)
    }

    /// A settle rule that reads the cost from the response header field `name`, a decimal
    /// integer (e.g. `x-tokens-used: 1234`). A response without the field, or with one that
    /// is not a number up to `u32::MAX`, keeps its reservation.
    ///
    /// ```
    /// use tollgate::{rate_limit::settle::ActualCost, Quota, RateLimitLayer};
    /// let layer = RateLimitLayer::new(Quota::per_minute(10_000))
    ///     .cost(|_| 500)
    ///     .settle(ActualCost::header("x-tokens-used"));
    /// # let _ = layer;
    /// ```
    pub fn header(name: &'static str) -> impl Fn(&Parts) -> Option<u32> + Send + Sync + 'static {
        let name = HeaderName::from_static(name);
        move |response: &Parts| {
            let value = response.headers.get(&name)?.to_str().ok()?;
            value.trim().parse::<u32>().ok()
        }
    }
}

/// How a layer settles the reservation of a request from its response.
#[derive(Clone)]
pub(crate) struct SettleRule {
    pub(crate) count: Option<Arc<CountFn>>,
    pub(crate) amount: Option<Arc<AmountFn>>,
}

impl SettleRule {
    /// A rule, when the layer has any.
    pub(crate) fn new(count: Option<Arc<CountFn>>, amount: Option<Arc<AmountFn>>) -> Option<Self> {
        (count.is_some() || amount.is_some()).then_some(SettleRule { count, amount })
    }

    /// The actual cost of a request that reserved `reserved`, from its response: 0 when the
    /// response does not count, else what the response reports, else the reservation.
    pub(crate) fn actual(&self, response: &Parts, reserved: u32) -> u32 {
        if let Some(count) = &self.count {
            if !count(response) {
                return 0;
            }
        }
        match &self.amount {
            Some(amount) => amount(response).unwrap_or(reserved),
            None => reserved,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use proptest::prelude::*;

    use crate::decision::Reservation;
    use crate::{Clock, Quota, RateLimiter};

    /// The reference: each quota's theoretical arrival time in whole milliseconds, decided
    /// all or nothing, refunds never before now, charges beyond the tolerance.
    struct Model {
        /// (interval, tolerance) per quota, in ms.
        quotas: Vec<(u64, u64)>,
        tats: Vec<u64>,
        now: u64,
    }

    impl Model {
        fn check(&mut self, cost: u64) -> bool {
            let new: Option<Vec<u64>> = self
                .quotas
                .iter()
                .zip(&self.tats)
                .map(|(&(t, tau), &tat)| {
                    let new = tat.max(self.now) + cost * t;
                    (new - self.now <= tau).then_some(new)
                })
                .collect();
            match new {
                Some(new) if cost > 0 => {
                    self.tats = new;
                    true
                }
                Some(_) => true,
                None => false,
            }
        }

        fn settle(&mut self, reserved: u64, actual: u64) {
            for (&(t, _), tat) in self.quotas.iter().zip(self.tats.iter_mut()) {
                if actual < reserved && *tat > self.now {
                    *tat = tat.saturating_sub((reserved - actual) * t).max(self.now);
                } else if actual > reserved {
                    *tat = (*tat).max(self.now) + (actual - reserved) * t;
                }
            }
        }

        /// Milliseconds each quota is ahead of now.
        fn ahead(&self) -> Vec<u64> {
            self.tats
                .iter()
                .map(|t| t.saturating_sub(self.now))
                .collect()
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        /// A request of this cost, settled at the actual cost if admitted.
        Request {
            cost: u32,
            actual: u32,
        },
        Wait {
            ms: u64,
        },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (0u32..6, 0u32..12).prop_map(|(cost, actual)| Op::Request { cost, actual }),
            1 => (0u64..3_000).prop_map(|ms| Op::Wait { ms }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Reserve, then settle, against the reference, with one quota and with two: the
        /// same admissions and the same times, debts included.
        #[test]
        fn reserve_then_settle_matches_the_reference(
            two in any::<bool>(),
            ops in proptest::collection::vec(op(), 1..120),
        ) {
            let (clock, hand) = Clock::manual();
            // 1 per 100 ms, burst 5; and 1 per 250 ms, burst 8.
            let mut builder = RateLimiter::<u8>::builder(
                Quota::new(1, Duration::from_millis(100)).burst(5),
            )
            .clock(clock);
            let mut quotas = vec![(100, 500)];
            if two {
                builder = builder.quota(Quota::new(1, Duration::from_millis(250)).burst(8));
                quotas.push((250, 2_000));
            }
            let limiter = builder.build();
            let n = quotas.len();
            let mut model = Model { quotas, tats: vec![0; n], now: 0 };
            for op in ops {
                match op {
                    Op::Request { cost, actual } => {
                        let d = limiter.check_n(&1, cost);
                        let admitted = model.check(u64::from(cost));
                        prop_assert_eq!(d.is_allowed(), admitted);
                        if admitted {
                            let _ = limiter.settle(&1, &Reservation::of(&d, cost), actual);
                            model.settle(u64::from(cost), u64::from(actual));
                        }
                    }
                    Op::Wait { ms } => {
                        hand.advance(Duration::from_millis(ms));
                        model.now += ms;
                    }
                }
                let ahead: Vec<u64> = limiter
                    .peek(&1)
                    .states()
                    .iter()
                    .map(|s| s.reset_after_nanos() / 1_000_000)
                    .collect();
                prop_assert_eq!(ahead, model.ahead());
            }
        }
    }
}
