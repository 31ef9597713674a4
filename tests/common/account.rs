//! The reference model of one key's account: the spec that the memory limiter, the HTTP layer
//! and Redis are checked against.
//!
//! A key's account is what its admitted requests took, where, and what came back:
//! * an admission of cost `c` at `now`, all or nothing over the quotas, records where its cost
//!   landed in each quota (GCRA: the slice of time `[start, end)` it added; a fixed window:
//!   the window's end; a sliding-window counter: the window's start; a sliding log: its own
//!   entry's time);
//! * a refund of `u` units gives back the end part of that and only what still counts now
//!   (nothing once the window has passed; a log entry its own units; GCRA the part of its own
//!   slice still ahead of now, never moving the time before now);
//! * a settlement above the cost charges the difference now, beyond any limit (a debt that
//!   stands; the log records it whole, as one entry);
//! * a change of quotas judges the stored state and never rewrites it (a fixed window keeps
//!   the end it opened with), except that what had left a sliding window when the change
//!   came stays gone (a log entry out of the old window; a counter's counts that no longer
//!   weighed).
//!
//! Written for clarity, not speed: sums by filtering, products in 128 bits.

#![allow(dead_code)]

use std::time::Duration;

use tollgate::Quota;

/// One quota, in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Gcra { interval: u64, burst: u64 },
    Fixed { limit: u64, width: u64 },
    Log { limit: u64, width: u64 },
    Counter { limit: u64, width: u64 },
}

impl Kind {
    /// The crate's quota for this kind.
    pub fn quota(&self) -> Quota {
        match *self {
            Kind::Gcra { interval, burst } => {
                Quota::new(1, Duration::from_nanos(interval)).burst(burst as u32)
            }
            Kind::Fixed { limit, width } => {
                Quota::fixed_window(limit as u32, Duration::from_nanos(width))
            }
            Kind::Log { limit, width } => {
                Quota::sliding_log(limit as u32, Duration::from_nanos(width))
            }
            Kind::Counter { limit, width } => {
                Quota::sliding_window(limit as u32, Duration::from_nanos(width))
            }
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Words {
    /// GCRA: tat. Fixed: end. Counter: start of the current window.
    a: u64,
    /// Fixed: used. Counter: the current window's count.
    used: u64,
    /// Counter: the previous window's count.
    prev: u64,
}

/// What an admission took.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Taken {
    pub cost: u32,
    spots: Vec<[u64; 2]>,
}

impl Taken {
    /// What an admission of cost 0 took.
    pub fn nothing() -> Self {
        Taken {
            cost: 0,
            spots: Vec::new(),
        }
    }
}

/// The account of one key.
#[derive(Debug, Clone)]
pub struct Account {
    pub quotas: Vec<Kind>,
    /// Per quota, the latest times that had left its windows at the changes (None: nothing
    /// has): (gone, gone_cur), see `set_quotas`.
    gone: Vec<(Option<u64>, Option<u64>)>,
    words: Vec<Words>,
    /// (time, cost) of every log entry, oldest first.
    log: Vec<(u64, u64)>,
}

/// What a decision says, as far as the model pins it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Said {
    pub allowed: bool,
    /// Remaining per quota.
    pub remaining: Vec<u64>,
}

impl Account {
    pub fn new(quotas: Vec<Kind>) -> Self {
        let n = quotas.len();
        Account {
            quotas,
            gone: vec![(None, None); n],
            words: vec![Words::default(); n],
            log: Vec::new(),
        }
    }

    /// Replaces the quotas at `now`: the stored state stays as it is, and what had left a
    /// sliding window by `now` stays gone: log entries at or before `now - width`; a
    /// counter's previous count once its window opened at or before `now - width`, both
    /// counts at or before `now - 2 width`.
    pub fn set_quotas(&mut self, now: u64, quotas: Vec<Kind>) {
        assert_eq!(quotas.len(), self.quotas.len());
        for (i, q) in self.quotas.iter().enumerate() {
            if let Kind::Log { width, .. } | Kind::Counter { width, .. } = *q {
                let (g, gc) = self.gone[i];
                self.gone[i] = (
                    g.max(now.checked_sub(width)),
                    gc.max(now.checked_sub(2 * width)),
                );
            }
        }
        self.quotas = quotas;
    }

    fn log_in(&self, i: usize, now: u64, width: u64) -> u64 {
        let gone = self.gone[i].0;
        self.log
            .iter()
            .filter(|(t, _)| t.saturating_add(width) > now && gone.map_or(true, |g| *t > g))
            .map(|e| e.1)
            .sum()
    }

    /// The counter's (start, prev, cur) at `now`.
    fn counter_at(
        w: &Words,
        gone: (Option<u64>, Option<u64>),
        width: u64,
        now: u64,
    ) -> (u64, u64, u64) {
        let mut w = *w;
        if gone.1.is_some_and(|g| w.a <= g) {
            return (now, 0, 0);
        }
        if gone.0.is_some_and(|g| w.a <= g) {
            w.prev = 0;
        }
        if w.prev == 0 && w.used == 0 {
            return (now, 0, 0);
        }
        let next = w.a.saturating_add(width);
        if now < next {
            (w.a, w.prev, w.used)
        } else if w.used > 0 && now < next.saturating_add(width) {
            (next, w.used, 0)
        } else {
            (now, 0, 0)
        }
    }

    fn fixed_at(w: &Words, width: u64, now: u64) -> (u64, u64) {
        if w.used > 0 && now < w.a {
            (w.a, w.used)
        } else {
            (now + width, 0)
        }
    }

    /// Whether quota `i` admits `c` now (cost 0: whether a request of nothing passes).
    fn fits(&self, i: usize, now: u64, c: u64) -> bool {
        let w = &self.words[i];
        match self.quotas[i] {
            Kind::Gcra { interval, burst } => {
                c <= burst && w.a.max(now) + c * interval - now <= burst * interval
            }
            Kind::Fixed { limit, width } => {
                let (_, used) = Self::fixed_at(w, width, now);
                c <= limit && used + c <= limit
            }
            Kind::Log { limit, width } => c <= limit && self.log_in(i, now, width) + c <= limit,
            Kind::Counter { limit, width } => {
                let (start, prev, cur) = Self::counter_at(w, self.gone[i], width, now);
                let e = (now - start).min(width);
                let lhs = u128::from(cur + c) * u128::from(width)
                    + u128::from(prev) * u128::from(width - e);
                c <= limit && lhs <= u128::from(limit) * u128::from(width)
            }
        }
    }

    fn remaining(&self, i: usize, now: u64) -> u64 {
        let w = &self.words[i];
        match self.quotas[i] {
            Kind::Gcra { interval, burst } => {
                let ahead = w.a.saturating_sub(now);
                (burst * interval).saturating_sub(ahead) / interval
            }
            Kind::Fixed { limit, width } => limit.saturating_sub(Self::fixed_at(w, width, now).1),
            Kind::Log { limit, width } => limit.saturating_sub(self.log_in(i, now, width)),
            Kind::Counter { limit, width } => {
                let (start, prev, cur) = Self::counter_at(w, self.gone[i], width, now);
                let e = (now - start).min(width);
                let weight = (u128::from(prev) * u128::from(width - e)).div_ceil(u128::from(width));
                (u128::from(limit).saturating_sub(u128::from(cur) + weight)) as u64
            }
        }
    }

    fn said(&self, now: u64, allowed: bool) -> Said {
        Said {
            allowed,
            remaining: (0..self.quotas.len())
                .map(|i| self.remaining(i, now))
                .collect(),
        }
    }

    fn log_limit(&self) -> Option<u64> {
        self.quotas
            .iter()
            .filter_map(|q| match q {
                Kind::Log { limit, .. } => Some(*limit),
                _ => None,
            })
            .max()
    }

    /// A request of `cost` at `now`: what the decision says and, when admitted with a cost,
    /// what it took.
    pub fn admit(&mut self, now: u64, cost: u32) -> (Said, Option<Taken>) {
        let c = u64::from(cost);
        let ok = (0..self.quotas.len()).all(|i| self.fits(i, now, c));
        if !ok || cost == 0 {
            return (self.said(now, ok), None);
        }
        let mut spots = Vec::new();
        for i in 0..self.quotas.len() {
            let q = self.quotas[i];
            let w = &mut self.words[i];
            spots.push(match q {
                Kind::Gcra { interval, .. } => {
                    let start = w.a.max(now);
                    w.a = start + c * interval;
                    [start, w.a]
                }
                Kind::Fixed { width, .. } => {
                    let (end, used) = Self::fixed_at(w, width, now);
                    *w = Words {
                        a: end,
                        used: used + c,
                        prev: 0,
                    };
                    [end, 0]
                }
                Kind::Counter { width, .. } => {
                    let (start, prev, cur) = Self::counter_at(w, self.gone[i], width, now);
                    *w = Words {
                        a: start,
                        used: cur + c,
                        prev,
                    };
                    [start, 0]
                }
                Kind::Log { .. } => [now, 0],
            });
        }
        if self.log_limit().is_some() {
            self.log.push((now, c));
        }
        (self.said(now, true), Some(Taken { cost, spots }))
    }

    /// Gives back `units` of what `taken` took, at `now`.
    pub fn refund(&mut self, now: u64, taken: &Taken, units: u32) {
        let u = u64::from(units.min(taken.cost));
        if u == 0 {
            return;
        }
        let mut log_time = None;
        for i in 0..self.quotas.len() {
            let spot = taken.spots[i];
            let q = self.quotas[i];
            let w = &mut self.words[i];
            match q {
                Kind::Gcra { .. } => {
                    let [start, end] = spot;
                    let part = (end - start) / u64::from(taken.cost) * u;
                    let back = end - (end - part).max(now).min(end);
                    if w.a > now {
                        w.a = w.a.saturating_sub(back).max(now);
                    }
                }
                Kind::Fixed { .. } => {
                    if w.used > 0 && now < w.a && w.a == spot[0] {
                        w.used = w.used.saturating_sub(u);
                        if w.used == 0 {
                            *w = Words::default();
                        }
                    }
                }
                Kind::Counter { width, .. } => {
                    let (start, mut prev, mut cur) = Self::counter_at(w, self.gone[i], width, now);
                    if prev == 0 && cur == 0 {
                        *w = Words::default();
                        continue;
                    }
                    if start == spot[0] {
                        cur = cur.saturating_sub(u);
                    } else if spot[0] + width == start {
                        prev = prev.saturating_sub(u);
                    } else {
                        continue;
                    }
                    *w = if prev == 0 && cur == 0 {
                        Words::default()
                    } else {
                        Words {
                            a: start,
                            used: cur,
                            prev,
                        }
                    };
                }
                Kind::Log { .. } => log_time = Some(spot[0]),
            }
        }
        if let Some(t) = log_time {
            let mut left = u;
            for e in self.log.iter_mut().rev().filter(|e| e.0 == t) {
                let back = e.1.min(left);
                e.1 -= back;
                left -= back;
            }
            self.log.retain(|e| e.1 > 0);
        }
    }

    /// Charges `cost` at `now` whatever the limits.
    pub fn charge(&mut self, now: u64, cost: u32) {
        let c = u64::from(cost);
        for i in 0..self.quotas.len() {
            let q = self.quotas[i];
            let w = &mut self.words[i];
            match q {
                Kind::Gcra { interval, .. } => w.a = w.a.max(now) + c * interval,
                Kind::Fixed { width, .. } => {
                    let (end, used) = Self::fixed_at(w, width, now);
                    *w = Words {
                        a: end,
                        used: used + c,
                        prev: 0,
                    };
                }
                Kind::Counter { width, .. } => {
                    let (start, prev, cur) = Self::counter_at(w, self.gone[i], width, now);
                    *w = Words {
                        a: start,
                        used: cur + c,
                        prev,
                    };
                }
                Kind::Log { .. } => {}
            }
        }
        if self.log_limit().is_some() && c > 0 {
            self.log.push((now, c));
        }
    }

    /// Settles what `taken` took at the `actual` cost, at `now`.
    pub fn settle(&mut self, now: u64, taken: &Taken, actual: u32) {
        if actual < taken.cost {
            self.refund(now, taken, taken.cost - actual);
        } else if actual > taken.cost {
            self.charge(now, actual - taken.cost);
        }
    }

    /// What a peek (cost 0) says.
    pub fn peek(&mut self, now: u64) -> Said {
        self.admit(now, 0).0
    }
}

/// The HTTP layer around a handler whose responses the test sends when it wants: a request
/// is decided when sent, and answered (settled, or refunded) later, on the layer's clock.
pub mod rig {
    use std::collections::HashMap;
    use std::convert::Infallible;
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::{Arc, Mutex};
    use std::task::{Context, Poll};

    use bytes::Bytes;
    use futures_util::FutureExt;
    use http::{Request, Response, StatusCode};
    use http_body_util::Full;
    use tokio::sync::oneshot;
    use tollgate::rate_limit::settle::ActualCost;
    use tower::{Service, ServiceExt};

    /// How the handler answers: a status, and the actual cost it reports, if any.
    #[derive(Debug, Clone, Copy)]
    pub struct Reply {
        pub status: u16,
        pub actual: Option<u32>,
    }

    /// A success: it does not count (the layers of these tests count only failures).
    pub const OK: Reply = Reply {
        status: 200,
        actual: None,
    };

    /// A failure: it counts, at the cost it reserved.
    pub const FAILED: Reply = Reply {
        status: 401,
        actual: None,
    };

    /// A failure that settles `n`.
    pub fn settles(n: u32) -> Reply {
        Reply {
            status: 401,
            actual: Some(n),
        }
    }

    /// A manual clock 1 000 s past its start, so that no time a test reads is near the
    /// crate's "never" (0).
    pub fn manual() -> (tollgate::Clock, tollgate::ManualClock) {
        let (clock, time) = tollgate::Clock::manual();
        time.advance(std::time::Duration::from_secs(1_000));
        (clock, time)
    }

    /// `n` failures sent for `key`, each answered at once; how many were admitted.
    pub async fn failures<S>(rig: &mut Rig<S>, key: &str, n: usize) -> usize
    where
        S: Service<Request<()>, Response = Response<Full<Bytes>>, Error = Infallible>,
    {
        let mut admitted = 0;
        for _ in 0..n {
            if let Some(id) = rig.send(key, 1).await {
                rig.answer(id, FAILED).await;
                admitted += 1;
            }
        }
        admitted
    }

    type Gates = Arc<Mutex<HashMap<u64, oneshot::Receiver<Reply>>>>;

    /// Answers each request with the reply its gate receives.
    #[derive(Clone, Default)]
    pub struct Handler {
        gates: Gates,
    }

    impl Service<Request<()>> for Handler {
        type Response = Response<Full<Bytes>>;
        type Error = Infallible;
        type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        /// A request without an `x-id` (sent by a test that holds nothing in flight) is
        /// answered `200` at once, with the `x-actual` header it carries, if any.
        fn call(&mut self, r: Request<()>) -> Self::Future {
            let gate = r.headers().get("x-id").map(|id| {
                let id: u64 = id.to_str().unwrap().parse().unwrap();
                self.gates.lock().unwrap().remove(&id).unwrap()
            });
            let actual = r.headers().get("x-actual").cloned();
            Box::pin(async move {
                let reply = match gate {
                    Some(gate) => gate.await.unwrap_or(OK),
                    None => OK,
                };
                let mut resp = Response::new(Full::new(Bytes::from_static(b"done")));
                *resp.status_mut() = StatusCode::from_u16(reply.status).unwrap();
                if let Some(n) = reply.actual {
                    resp.extensions_mut().insert(ActualCost(n));
                }
                if let Some(actual) = actual {
                    resp.headers_mut().insert("x-actual", actual);
                }
                Ok(resp)
            })
        }
    }

    type Pending<F> = (oneshot::Sender<Reply>, Pin<Box<F>>);

    /// A service of the layer around [`Handler`], and the requests it holds in flight.
    pub struct Rig<S: Service<Request<()>>> {
        svc: S,
        gates: Gates,
        pending: HashMap<u64, Pending<S::Future>>,
        next: u64,
    }

    impl<S> Rig<S>
    where
        S: Service<Request<()>, Response = Response<Full<Bytes>>, Error = Infallible>,
    {
        /// `make` wraps the handler in the layer.
        pub fn new(make: impl FnOnce(Handler) -> S) -> Self {
            let handler = Handler::default();
            let gates = handler.gates.clone();
            Rig {
                svc: make(handler),
                gates,
                pending: HashMap::new(),
                next: 0,
            }
        }

        /// Sends a request of `cost` for `key`: `Some(id)` when admitted (held in flight until
        /// [`answer`](Self::answer)ed), `None` when rejected.
        pub async fn send(&mut self, key: &str, cost: u32) -> Option<u64> {
            self.next += 1;
            let id = self.next;
            let (tx, rx) = oneshot::channel();
            self.gates.lock().unwrap().insert(id, rx);
            let req = Request::post("/")
                .header("x-key", key)
                .header("x-cost", cost.to_string())
                .header("x-id", id.to_string())
                .body(())
                .unwrap();
            let svc = self.svc.ready().await.unwrap();
            let mut fut = Box::pin(svc.call(req));
            // Decided at once in memory; after a round trip on Redis: wait until the request
            // is either answered (rejected) or with the handler (admitted).
            for _ in 0..100_000 {
                if let Some(resp) = (&mut fut).now_or_never() {
                    let resp = resp.unwrap();
                    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
                    self.gates.lock().unwrap().remove(&id);
                    return None;
                }
                if !self.gates.lock().unwrap().contains_key(&id) {
                    self.pending.insert(id, (tx, fut));
                    return Some(id);
                }
                tokio::task::yield_now().await;
            }
            panic!("request {id} neither decided nor handled");
        }

        /// Answers request `id` with `reply`, and returns its response's status.
        pub async fn answer(&mut self, id: u64, reply: Reply) -> u16 {
            let (tx, fut) = self.pending.remove(&id).expect("a request in flight");
            let _ = tx.send(reply);
            fut.await.unwrap().status().as_u16()
        }

        /// The requests in flight.
        pub fn in_flight(&self) -> Vec<u64> {
            let mut ids: Vec<u64> = self.pending.keys().copied().collect();
            ids.sort_unstable();
            ids
        }
    }
}
