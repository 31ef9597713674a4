//! What a decision says, for every quota kind and store: the [`Outcome`], each quota's
//! [`QuotaState`], the [`Decision`] a check returns and the [`Decisions`] of stacked layers, and
//! what an admission took ([`Reservation`]) for a refund or a settlement. Plain data: the
//! algorithms that make decisions live in `crate::algo`, the stores that keep their state in
//! `crate::store`.

use std::time::Duration;

/// The most quotas one policy may hold (they are decided together for each request).
pub const MAX_QUOTAS: usize = 4;

/// Whether a request was admitted.
///
/// More outcomes may come in later versions: match with a `_` arm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// Admitted: the cost was taken from every quota.
    Allowed,
    /// Rejected: admissible after [`Decision::retry_after`]. Nothing was consumed.
    Limited,
    /// Rejected, and it always will be: the cost is larger than the burst of at least one
    /// quota. Nothing was consumed, and there is no time after which to retry.
    Exceeds,
    /// Rejected because the key is banned by a
    /// [penalty box](crate::penalty), until [`Decision::retry_after`]. The quotas were not
    /// asked and nothing was consumed.
    Banned,
}

/// The state of one quota after a decision, as the `RateLimit` header field reports it.
///
/// Holds the quota's numbers and how far the key is ahead of now; the figures are computed
/// when asked, so a caller that only wants [`Decision::is_allowed`] pays for no division.
/// A window quota ([`QuotaKind`](crate::QuotaKind)) holds its figures as they are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QuotaState {
    /// GCRA: the emission interval. Zero for a window quota, whose `tolerance` then holds
    /// `limit << 32 | remaining`.
    interval: u64,
    tolerance: u64,
    /// Nanoseconds the key's theoretical arrival time is ahead of now (a window quota: until
    /// it is back to its full limit).
    ahead: u64,
}

impl QuotaState {
    /// The state of a GCRA quota of emission interval `interval` and tolerance `tolerance`
    /// (both nonzero) for a key `ahead` nanoseconds ahead of now.
    #[inline]
    pub(crate) const fn timed(interval: u64, tolerance: u64, ahead: u64) -> Self {
        QuotaState {
            interval,
            tolerance,
            ahead,
        }
    }

    /// The state of a window quota: its `limit` (at most `u32::MAX`), what `remaining` it
    /// has now, and `reset` nanoseconds until it is back to its full limit.
    #[inline]
    pub(crate) fn counted(limit: u64, remaining: u64, reset: u64) -> Self {
        let limit = limit.min(u64::from(u32::MAX));
        QuotaState {
            interval: 0,
            tolerance: (limit << 32) | remaining.min(limit),
            ahead: reset,
        }
    }

    /// Nanoseconds until this quota is back to its full burst.
    pub(crate) fn reset_after_nanos(&self) -> u64 {
        self.ahead
    }

    /// The burst of the quota (`q` in `RateLimit-Policy`).
    #[inline]
    pub fn limit(&self) -> u64 {
        if self.interval == 0 {
            return self.tolerance >> 32;
        }
        self.tolerance / self.interval
    }

    /// Whole requests (of cost 1) still admissible now (`r` in `RateLimit`).
    #[inline]
    pub fn remaining(&self) -> u64 {
        if self.interval == 0 {
            return self.tolerance & 0xffff_ffff;
        }
        self.tolerance.saturating_sub(self.ahead) / self.interval
    }

    /// Time until this quota is back to its full burst (`t` in `RateLimit`, rounded up).
    #[inline]
    pub fn reset_after(&self) -> Duration {
        Duration::from_nanos(self.ahead)
    }
}

/// The answer to one request: what `CL.THROTTLE` returns, for every quota of the policy.
///
/// ```
/// use tollgate::{Quota, RateLimiter};
///
/// let limiter = RateLimiter::<&str>::new(Quota::per_second(10).burst(5));
/// for _ in 0..5 {
///     assert!(limiter.check(&"k").is_allowed());
/// }
/// let d = limiter.check(&"k");
/// assert!(!d.is_allowed());
/// assert_eq!(d.remaining(), 0);
/// assert!(d.retry_after().is_some());
/// ```
///
/// A decision is `#[must_use]`: an admitted one has already taken its cost, so dropping it
/// unread (`limiter.check(&key);`) spends quota in silence.
#[derive(Clone, Copy)]
#[must_use = "an admitted decision has taken its cost: read it (is_allowed) or drop it with `let _ =`"]
pub struct Decision {
    outcome: Outcome,
    /// How many of `quotas` the policy has (the bits of [`LEN`]), and the flags
    /// [`DEGRADED`], [`LOCAL`] and [`FULL`].
    len: u8,
    /// The generation of the quotas that judged it (see [`Decision::generation`]).
    generation: u16,
    /// What an admission took (0: nothing, and always 0 unless allowed).
    cost: u32,
    quotas: [QuotaState; MAX_QUOTAS],
    /// Allowed: where the cost landed in each quota (see [`Reservation`]), for a refund or a
    /// settlement. Otherwise, only the wait in nanoseconds, in `after[0][0]`: a decision that
    /// took nothing has no spots, and an admitted one no wait, so the two share the words.
    after: [[u64; 2]; MAX_QUOTAS],
}

/// The bits of `len` that count the quotas (at most [`MAX_QUOTAS`]).
const LEN: u8 = 7;
/// Made without the store: by its failure policy, or by its local fallback.
const DEGRADED: u8 = 8;
/// Made by a store's local fallback, on the scaled quotas (and degraded).
const LOCAL: u8 = 16;
/// A new key turned away because the store is full: no fault of the key's own traffic.
const FULL: u8 = 32;

impl std::fmt::Debug for Decision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decision")
            .field("outcome", &self.outcome)
            .field("retry_after", &self.wait())
            .field("degraded", &self.is_degraded())
            .field("local", &self.is_local())
            .field("full", &self.is_store_full())
            .field("quotas", &self.states())
            .field("taken", &self.taken())
            .finish()
    }
}

/// What a decision says is compared; what an admission took is not.
impl PartialEq for Decision {
    fn eq(&self, other: &Self) -> bool {
        self.outcome == other.outcome
            && self.wait() == other.wait()
            && self.len == other.len
            && self.states() == other.states()
    }
}

impl Eq for Decision {}

impl Decision {
    /// This decision, recording that its admission took `taken` (nothing when it was not
    /// admitted).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn with_taken(mut self, taken: Reservation) -> Decision {
        if self.is_allowed() {
            self.cost = taken.cost;
            self.after = taken.spots;
        }
        self
    }

    /// A decision of `outcome` (waiting `retry_after` nanoseconds when limited or banned) on
    /// the first `len` of `quotas`, whose admission took `taken`.
    #[inline]
    pub(crate) fn new(
        outcome: Outcome,
        retry_after: u64,
        quotas: [QuotaState; MAX_QUOTAS],
        len: usize,
        taken: Reservation,
    ) -> Decision {
        let (cost, after) = if outcome == Outcome::Allowed {
            (taken.cost, taken.spots)
        } else {
            let mut after = [[0; 2]; MAX_QUOTAS];
            after[0][0] = retry_after;
            (0, after)
        };
        Decision {
            outcome,
            len: len.min(MAX_QUOTAS) as u8,
            generation: 0,
            cost,
            quotas,
            after,
        }
    }

    /// The figures of each quota, and where an admission's cost lands in each quota, to be
    /// written in place one quota at a time before [`conclude`](Self::conclude) says the
    /// rest: a decision made under a key's lock is then written where its caller keeps it,
    /// never assembled elsewhere and copied.
    #[inline]
    pub(crate) fn parts_mut(
        &mut self,
    ) -> (&mut [QuotaState; MAX_QUOTAS], &mut [[u64; 2]; MAX_QUOTAS]) {
        (&mut self.quotas, &mut self.after)
    }

    /// Makes this the decision [`new`](Self::new) makes of `outcome`, `retry_after`, `len`
    /// and an admission at `cost`, with the figures and spots written through
    /// [`parts_mut`](Self::parts_mut) (the figures of quotas past `len` left as they are;
    /// the spots read only when admitted at a cost).
    #[inline]
    pub(crate) fn conclude(&mut self, outcome: Outcome, retry_after: u64, len: usize, cost: u32) {
        if outcome != Outcome::Allowed || cost == 0 {
            self.after = [[0; 2]; MAX_QUOTAS];
            if outcome != Outcome::Allowed {
                self.after[0][0] = retry_after;
            }
        }
        self.outcome = outcome;
        // The count alone: no flag set, as `new` makes it.
        self.len = len.min(MAX_QUOTAS) as u8;
        self.generation = 0;
        self.cost = if outcome == Outcome::Allowed { cost } else { 0 };
    }

    /// The wait in nanoseconds that the decision was made with (0 when allowed).
    #[inline]
    fn wait(&self) -> u64 {
        if self.outcome == Outcome::Allowed {
            0
        } else {
            self.after[0][0]
        }
    }

    /// What the admission took (nothing unless allowed).
    #[inline]
    fn taken(&self) -> Reservation {
        if self.outcome == Outcome::Allowed {
            Reservation {
                cost: self.cost,
                spots: self.after,
            }
        } else {
            Reservation::none()
        }
    }

    /// This decision, made without the store (by its failure policy).
    pub(crate) fn made_degraded(mut self) -> Decision {
        self.len |= DEGRADED;
        self
    }

    /// This decision, for a new key turned away because the store is full.
    pub(crate) fn made_full(mut self) -> Decision {
        self.len |= FULL;
        self
    }

    /// This decision, judged by the quotas of `generation`: the number of changes a limiter
    /// had made to its quotas when it loaded those that judged it (wrapping), stamped where
    /// the limiter loads them, so that the HTTP layer answers with the fields of the policy
    /// that judged the request whatever changed since.
    #[inline]
    pub(crate) fn stamped(mut self, generation: u16) -> Decision {
        self.stamp(generation);
        self
    }

    /// Stamps this decision, where it lies, with `generation` (see [`stamped`](Self::stamped)):
    /// a decision just written is not moved for it.
    #[inline]
    pub(crate) fn stamp(&mut self, generation: u16) {
        self.generation = generation;
    }

    /// The generation of the quotas that judged this decision (see [`stamped`](Self::stamped));
    /// 0 for one no limiter judged.
    #[inline]
    pub(crate) fn generation(&self) -> u16 {
        self.generation
    }

    /// Whether the request was admitted.
    #[inline]
    pub fn is_allowed(&self) -> bool {
        self.outcome == Outcome::Allowed
    }

    /// Admitted, limited for now, never admissible, or banned.
    pub fn outcome(&self) -> Outcome {
        self.outcome
    }

    /// The burst of the [most restrictive](Self::most_restrictive) quota; `u64::MAX` for an
    /// [unlimited](Self::is_unlimited) request.
    pub fn limit(&self) -> u64 {
        match self.most_restrictive() {
            Some(s) => s.limit(),
            None => u64::MAX,
        }
    }

    /// Whole requests still admissible now: the least over all quotas; `u64::MAX` for an
    /// [unlimited](Self::is_unlimited) request.
    pub fn remaining(&self) -> u64 {
        match self.most_restrictive() {
            Some(s) => s.remaining(),
            None => u64::MAX,
        }
    }

    /// The quota that binds the key most: the one with the fewest requests remaining, and among
    /// those the one that takes longest to be back to its full burst (then the first listed).
    /// This is the quota the legacy `X-RateLimit-*` fields describe. `None` for an
    /// [unlimited](Self::is_unlimited) request.
    pub fn most_restrictive(&self) -> Option<QuotaState> {
        let mut best: Option<QuotaState> = None;
        for s in self.states() {
            let tighter = match &best {
                None => true,
                Some(b) => {
                    (s.remaining(), std::cmp::Reverse(s.ahead))
                        < (b.remaining(), std::cmp::Reverse(b.ahead))
                }
            };
            if tighter {
                best = Some(*s);
            }
        }
        best
    }

    /// Whether the request passed a [`RateLimitLayer`](crate::RateLimitLayer) without being
    /// decided: a skip rule (`skip_method`, `skip_path`, `skip_if`) or
    /// [`MissingKey::Allow`](crate::MissingKey::Allow) let it through uncounted. Such a
    /// decision is allowed, has no quota [`states`](Self::states), reports `u64::MAX` for
    /// [`limit`](Self::limit) and [`remaining`](Self::remaining) and zero for
    /// [`reset_after`](Self::reset_after).
    #[inline]
    pub fn is_unlimited(&self) -> bool {
        self.len & LEN == 0
    }

    /// The decision recorded for a request that a layer let through without deciding.
    pub(crate) fn unlimited() -> Decision {
        Decision::new(
            Outcome::Allowed,
            0,
            [QuotaState::default(); MAX_QUOTAS],
            0,
            Reservation::none(),
        )
    }

    /// When [`Outcome::Limited`], how long until the same request would be admitted (the
    /// longest wait among the quotas that rejected it); when [`Outcome::Banned`], the time
    /// left of the ban. `None` when allowed, and when the request can never be admitted.
    pub fn retry_after(&self) -> Option<Duration> {
        match self.outcome {
            Outcome::Limited | Outcome::Banned => Some(Duration::from_nanos(self.wait())),
            _ => None,
        }
    }

    /// Time until every quota is back to its full burst (the longest over the quotas).
    pub fn reset_after(&self) -> Duration {
        let max = self.states().iter().map(|s| s.ahead).max();
        Duration::from_nanos(max.unwrap_or(0))
    }

    /// Whether this decision was made without the store: a remote store (Redis) could not be
    /// reached in time, and its failure policy decided instead. Always `false` for the memory
    /// store.
    ///
    /// * Fail open or fail closed: the request was admitted or turned away without the
    ///   quotas. Such a decision knows nothing of the key's state: every quota reports
    ///   `remaining` 0 and its whole burst period as `reset_after`, and the HTTP layer sends no
    ///   `RateLimit` fields with it.
    /// * The local fallback ([`is_local`](Self::is_local)): decided in this process on the
    ///   policy's quotas scaled down; its states are the local limiter's, and the HTTP layer
    ///   answers it as any decision (fields, `429`, `Retry-After`).
    #[inline]
    pub fn is_degraded(&self) -> bool {
        self.len & DEGRADED != 0
    }

    /// Whether this decision was made by the local fallback of a Redis store
    /// (`FailMode::Local`, feature `redis`) while Redis could not be reached: a real decision
    /// on the policy's quotas scaled to the fallback's share, made in memory by this process
    /// alone. Always [`is_degraded`](Self::is_degraded) too; its [`states`](Self::states),
    /// [`remaining`](Self::remaining) and [`retry_after`](Self::retry_after) are those of the
    /// scaled quotas.
    #[inline]
    pub fn is_local(&self) -> bool {
        self.len & LOCAL != 0
    }

    /// The state of each quota, in the order the policy lists them.
    #[inline]
    pub fn states(&self) -> &[QuotaState] {
        &self.quotas[..usize::from(self.len & LEN)]
    }

    /// This decision, made by a store's local fallback: degraded and local. `keep_exceeds`:
    /// whether a cost above a scaled burst is above the policy's too (never admissible);
    /// otherwise it is limited for `retry_after` nanoseconds, when the store may be back.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn made_locally(mut self, keep_exceeds: bool, retry_after: u64) -> Decision {
        if self.outcome == Outcome::Exceeds && !keep_exceeds {
            self.outcome = Outcome::Limited;
            self.after[0][0] = retry_after;
        }
        self.len |= DEGRADED | LOCAL;
        self
    }

    /// Whether this is a new key turned away because the store was full of active keys
    /// ([`OnFull::RejectNewKeys`](crate::store::OnFull::RejectNewKeys)): a refusal for the
    /// server's state, which a [penalty box](crate::penalty) does not count as a strike.
    pub fn is_store_full(&self) -> bool {
        self.len & FULL != 0
    }

    /// A decision a remote store made and sent back: its outcome, the wait in nanoseconds and
    /// each quota's state, in the policy's order (at most [`MAX_QUOTAS`] are kept).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn from_store(
        outcome: Outcome,
        retry_after: u64,
        states: &[QuotaState],
    ) -> Decision {
        let mut quotas = [QuotaState::default(); MAX_QUOTAS];
        let len = states.len().min(MAX_QUOTAS);
        quotas[..len].copy_from_slice(&states[..len]);
        Decision::new(outcome, retry_after, quotas, len, Reservation::none())
    }
}

/// The decisions after the first, for a request admitted by several stacked layers.
#[derive(Debug, Clone)]
struct Stack(Vec<Decision>);

/// Every decision that admitted a request, outermost layer first.
///
/// Each [`RateLimitLayer`](crate::RateLimitLayer) that admits a request records its
/// [`Decision`] in the request's extensions; with layers stacked (a global limit outside a
/// per-route one, say) the request carries one per layer. `Decision` alone is the innermost
/// (the last made); `Decisions` is all of them, in the order they were made. A layer that let
/// the request through without deciding (a skip rule, `MissingKey::Allow`) adds nothing here.
///
/// With the `axum` feature, a handler takes it as an extractor; otherwise read it from the
/// request with [`Decisions::from_extensions`].
///
/// ```
/// use tollgate::{Decisions, Quota, RateLimitLayer};
/// use tower::{service_fn, Layer, ServiceExt};
///
/// # tokio_test_block_on(async {
/// let handler = service_fn(|req: http::Request<()>| async move {
///     let all = Decisions::from_extensions(req.extensions());
///     let limits: Vec<u64> = all.iter().map(|d| d.limit()).collect();
///     let body = bytes::Bytes::from(format!("{limits:?}"));
///     Ok::<_, std::convert::Infallible>(http::Response::new(body))
/// });
/// let inner = RateLimitLayer::new(Quota::per_second(5)).layer(handler);
/// let outer = RateLimitLayer::new(Quota::per_second(100)).layer(inner);
/// let resp = outer.oneshot(http::Request::new(())).await.unwrap();
/// assert_eq!(resp.body(), "[100, 5]".as_bytes());
/// # });
/// # fn tokio_test_block_on<F: std::future::Future>(f: F) -> F::Output {
/// #     tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(f)
/// # }
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Decisions(Vec<Decision>);

impl Decisions {
    /// The decisions recorded in `ext` (a request's extensions), outermost first; empty when
    /// no layer decided the request.
    pub fn from_extensions(ext: &http::Extensions) -> Self {
        if let Some(stack) = ext.get::<Stack>() {
            return Decisions(stack.0.clone());
        }
        match ext.get::<Decision>() {
            Some(d) if !d.is_unlimited() => Decisions(vec![*d]),
            _ => Decisions(Vec::new()),
        }
    }

    /// The decisions, outermost first.
    pub fn as_slice(&self) -> &[Decision] {
        &self.0
    }

    /// The decisions, outermost first.
    pub fn iter(&self) -> std::slice::Iter<'_, Decision> {
        self.0.iter()
    }

    /// How many layers decided the request.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether no layer decided the request.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl<'a> IntoIterator for &'a Decisions {
    type Item = &'a Decision;
    type IntoIter = std::slice::Iter<'a, Decision>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

/// Records in `ext` that a layer admitted the request with `d`: `d` becomes the request's
/// [`Decision`], and joins the [`Decisions`] of the layers outside.
pub(crate) fn record_admitted(ext: &mut http::Extensions, d: &Decision) {
    // Copied once, into the extensions' box.
    let Some(prev) = ext.insert(*d) else { return };
    if prev.is_unlimited() {
        return;
    }
    match ext.get_mut::<Stack>() {
        Some(stack) => stack.0.push(*d),
        None => {
            ext.insert(Stack(vec![prev, *d]));
        }
    }
}

/// Records in `ext` that a layer let the request through without deciding, unless a layer
/// outside already decided it (whose decision then stands).
pub(crate) fn record_unlimited(ext: &mut http::Extensions) {
    if ext.get::<Decision>().is_none() {
        ext.insert(Decision::unlimited());
    }
}

/// What an admitted request took from its key, per quota, so that a refund or a settlement
/// gives back exactly that, and only the part of it that still counts when it arrives.
///
/// Each quota's spot is two numbers, by kind:
/// * GCRA and warm-up: the slice `[start, end)` of time the request added to the key's
///   theoretical arrival time, measured with the quota in force then;
/// * fixed window: the end of the window it was counted in;
/// * sliding-window counter: the start of the window it was counted in;
/// * sliding log: the time of its own entry in the log.
///
/// Empty (`cost` 0) for a request that took nothing.
///
/// Named in the sealed store trait's hidden methods; not part of the crate's API.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reservation {
    /// The cost taken.
    pub(crate) cost: u32,
    /// Where it landed, per quota in the policy's order.
    pub(crate) spots: [[u64; 2]; MAX_QUOTAS],
}

impl Reservation {
    /// A reservation of nothing.
    pub(crate) const fn none() -> Self {
        Reservation {
            cost: 0,
            spots: [[0; 2]; MAX_QUOTAS],
        }
    }

    /// What the admission `d` of a request of `cost` took: its reservation, or the cost
    /// alone when the store that decided did not say where it landed.
    pub(crate) fn of(d: &Decision, cost: u32) -> Self {
        if d.is_allowed() && d.cost == cost {
            Reservation {
                cost,
                spots: d.after,
            }
        } else {
            Reservation {
                cost,
                ..Reservation::none()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! The decision whose wait and reservation share their words, and whose flags are bits,
    //! held to a model of the plain layout it replaces: every field on its own.
    use super::*;
    use proptest::prelude::*;

    /// A quota's state as plain numbers: GCRA `(interval, tolerance, ahead)` or a window's
    /// `(limit, remaining, reset)`.
    #[derive(Debug, Clone, Copy)]
    enum ModelState {
        Timed(u64, u64, u64),
        Counted(u64, u64, u64),
    }

    impl ModelState {
        fn limit(self) -> u64 {
            match self {
                ModelState::Timed(i, t, _) => t / i,
                ModelState::Counted(l, _, _) => l.min(u64::from(u32::MAX)),
            }
        }
        fn remaining(self) -> u64 {
            match self {
                ModelState::Timed(i, t, a) => t.saturating_sub(a) / i,
                ModelState::Counted(l, r, _) => r.min(l).min(u64::from(u32::MAX)),
            }
        }
        fn ahead(self) -> u64 {
            match self {
                ModelState::Timed(_, _, a) | ModelState::Counted(_, _, a) => a,
            }
        }
        fn state(self) -> QuotaState {
            match self {
                ModelState::Timed(i, t, a) => QuotaState::timed(i, t, a),
                ModelState::Counted(l, r, a) => QuotaState::counted(l, r, a),
            }
        }
    }

    /// The decision as the plain layout held it.
    #[derive(Debug, Clone)]
    struct Model {
        outcome: Outcome,
        retry_after: u64,
        degraded: bool,
        local: bool,
        full: bool,
        states: Vec<ModelState>,
        taken: Reservation,
    }

    fn outcome() -> impl Strategy<Value = Outcome> {
        prop_oneof![
            Just(Outcome::Allowed),
            Just(Outcome::Limited),
            Just(Outcome::Exceeds),
            Just(Outcome::Banned)
        ]
    }

    fn model_state() -> impl Strategy<Value = ModelState> {
        let time = prop_oneof![0..1_000u64, 0..u64::MAX, Just(u64::MAX)];
        prop_oneof![
            (1..5_000_000_000u64, 1..=u64::from(u32::MAX), time.clone())
                .prop_map(|(i, burst, a)| ModelState::Timed(i, i.saturating_mul(burst), a)),
            (0..u64::MAX, 0..u64::MAX, time.clone())
                .prop_map(|(l, r, a)| ModelState::Counted(l, r, a)),
            (0..50u64, 0..60u64, time).prop_map(|(l, r, a)| ModelState::Counted(l, r, a)),
        ]
    }

    fn model() -> impl Strategy<Value = Model> {
        (
            outcome(),
            0..u64::MAX,
            proptest::collection::vec(model_state(), 0..=MAX_QUOTAS),
            0..3u32,
            any::<[[u64; 2]; MAX_QUOTAS]>(),
        )
            .prop_map(|(outcome, retry_after, states, cost, spots)| {
                // What the stores make: a reservation only for an admission at a cost.
                let taken = if outcome == Outcome::Allowed && cost > 0 {
                    Reservation { cost, spots }
                } else {
                    Reservation::none()
                };
                Model {
                    outcome,
                    retry_after,
                    degraded: false,
                    local: false,
                    full: false,
                    states,
                    taken,
                }
            })
    }

    fn built(m: &Model) -> Decision {
        let mut quotas = [QuotaState::default(); MAX_QUOTAS];
        for (q, s) in quotas.iter_mut().zip(&m.states) {
            *q = s.state();
        }
        Decision::new(m.outcome, m.retry_after, quotas, m.states.len(), m.taken)
    }

    /// What any change of flags does to the model, as the plain layout did it.
    #[derive(Debug, Clone, Copy)]
    enum Change {
        Degraded,
        Full,
        Locally(bool, u64),
    }

    fn change() -> impl Strategy<Value = Change> {
        prop_oneof![
            Just(Change::Degraded),
            Just(Change::Full),
            (any::<bool>(), 0..u64::MAX).prop_map(|(k, r)| Change::Locally(k, r)),
        ]
    }

    fn apply(m: &mut Model, d: Decision, c: Change) -> Decision {
        match c {
            Change::Degraded => {
                m.degraded = true;
                d.made_degraded()
            }
            Change::Full => {
                m.full = true;
                d.made_full()
            }
            Change::Locally(keep, retry) => {
                if m.outcome == Outcome::Exceeds && !keep {
                    m.outcome = Outcome::Limited;
                    m.retry_after = retry;
                }
                m.degraded = true;
                m.local = true;
                d.made_locally(keep, retry)
            }
        }
    }

    fn says_the_same(d: &Decision, m: &Model, cost: u32) -> Result<(), TestCaseError> {
        prop_assert_eq!(d.outcome(), m.outcome);
        prop_assert_eq!(d.is_allowed(), m.outcome == Outcome::Allowed);
        prop_assert_eq!(d.is_unlimited(), m.states.is_empty());
        prop_assert_eq!(
            (d.is_degraded(), d.is_local(), d.is_store_full()),
            (m.degraded, m.local, m.full)
        );
        let retry = match m.outcome {
            Outcome::Limited | Outcome::Banned => Some(Duration::from_nanos(m.retry_after)),
            _ => None,
        };
        prop_assert_eq!(d.retry_after(), retry);
        prop_assert_eq!(d.states().len(), m.states.len());
        for (s, ms) in d.states().iter().zip(&m.states) {
            prop_assert_eq!(s.limit(), ms.limit());
            prop_assert_eq!(s.remaining(), ms.remaining());
            prop_assert_eq!(s.reset_after(), Duration::from_nanos(ms.ahead()));
            prop_assert_eq!(s.reset_after_nanos(), ms.ahead());
        }
        // The most restrictive: fewest remaining, then longest to reset, then first listed.
        let mut best: Option<ModelState> = None;
        for &s in &m.states {
            let tighter = best.is_none_or(|b| {
                (s.remaining(), std::cmp::Reverse(s.ahead()))
                    < (b.remaining(), std::cmp::Reverse(b.ahead()))
            });
            if tighter {
                best = Some(s);
            }
        }
        let most = d.most_restrictive();
        prop_assert_eq!(most.map(|s| s.limit()), best.map(ModelState::limit));
        prop_assert_eq!(most.map(|s| s.remaining()), best.map(ModelState::remaining));
        prop_assert_eq!(
            most.map(|s| s.reset_after_nanos()),
            best.map(ModelState::ahead)
        );
        prop_assert_eq!(d.limit(), best.map_or(u64::MAX, ModelState::limit));
        prop_assert_eq!(d.remaining(), best.map_or(u64::MAX, ModelState::remaining));
        let reset = m.states.iter().map(|s| s.ahead()).max().unwrap_or(0);
        prop_assert_eq!(d.reset_after(), Duration::from_nanos(reset));
        // What the admission took, as the plain layout gave it back.
        let plain = if m.taken.cost == cost {
            m.taken
        } else {
            Reservation {
                cost,
                ..Reservation::none()
            }
        };
        prop_assert_eq!(Reservation::of(d, cost), plain);
        Ok(())
    }

    #[test]
    fn a_decision_is_forty_bytes_a_quota_and_eight_more() {
        assert_eq!(std::mem::size_of::<QuotaState>(), 24);
        assert_eq!(std::mem::size_of::<Decision>(), 40 * MAX_QUOTAS + 8);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2_000))]

        #[test]
        fn a_decision_says_what_the_plain_layout_said_and_gives_back_what_was_taken(
            mut m in model(),
            changes in proptest::collection::vec(change(), 0..4),
            cost in 0..3u32,
        ) {
            let mut d = built(&m);
            says_the_same(&d, &m, cost)?;
            says_the_same(&d, &m, m.taken.cost)?;
            for c in changes {
                d = apply(&mut m, d, c);
                says_the_same(&d, &m, cost)?;
                says_the_same(&d, &m, m.taken.cost)?;
            }
        }

        #[test]
        fn a_decision_keeps_its_generation_through_every_change_of_flags_and_says_the_same(
            mut m in model(),
            changes in proptest::collection::vec(change(), 0..4),
            generation in any::<u16>(),
        ) {
            let plain = built(&m);
            let mut d = plain.stamped(generation);
            prop_assert_eq!(d, plain);
            for c in changes {
                d = apply(&mut m, d, c);
                prop_assert_eq!(d.generation(), generation);
                says_the_same(&d, &m, m.taken.cost)?;
            }
        }

        #[test]
        fn decisions_are_equal_when_they_say_the_same_whatever_they_took(
            m in model(),
            spots in any::<[[u64; 2]; MAX_QUOTAS]>(),
        ) {
            let d = built(&m);
            let mut other = m.clone();
            if other.outcome == Outcome::Allowed {
                other.taken.spots = spots;
            }
            prop_assert_eq!(d, built(&other));
            let mut later = m.clone();
            later.retry_after = later.retry_after.wrapping_add(1);
            // The wait is part of what a decision says unless it was admitted.
            prop_assert_eq!(d == built(&later), m.outcome == Outcome::Allowed);
        }

        #[test]
        fn a_store_gives_its_reservation_to_an_admission_only(
            m in model(),
            spots in any::<[[u64; 2]; MAX_QUOTAS]>(),
            cost in 1..3u32,
        ) {
            let d = built(&m).with_taken(Reservation { cost, spots });
            let mut expect = m.clone();
            if m.outcome == Outcome::Allowed {
                expect.taken = Reservation { cost, spots };
            }
            says_the_same(&d, &expect, cost)?;
        }
    }
}
