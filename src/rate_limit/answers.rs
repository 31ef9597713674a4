//! What a rate limit's decision adds to its request and its response, whatever the store and
//! the key: the tiers' live policies and their header fields, the decision in the request's
//! extensions, the rejection, and what an admission took (given back when a layer inside
//! rejects, or settled from the response). The header fields of one response are built and
//! applied here, and nowhere else.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};

use super::policy::Policy;
use super::settle::SettleRule;
use crate::algo::Rule;
use crate::decision::{Decision, Outcome, Reservation};
use crate::error::ConfigError;
use crate::headers::{append_fields, Legacy, PolicyHeaders};
use crate::key::RequestHead;
use crate::observe::{DecisionMeter, Names, Observe, Verdict};
use crate::response::refuse::Refuser;
use crate::response::{OnReject, Recipient, Rejection, RejectionKind};
use crate::store::backend::Backend;

/// How one policy of a layer answers: its name and, replaced with its quotas while serving,
/// the policy in force and its header fields.
pub(crate) struct Tier {
    pub(crate) name: Box<str>,
    pub(crate) live: ArcSwap<LiveTier>,
    /// The id of the live policy's header fields ([`PolicyHeaders::id`]), set after `live`,
    /// and 0 while a change is being made ([`Tier::change`]): the fields a repeated decision
    /// gets come from each thread's cache of them without loading `live`, and a decision
    /// made between two equal readings of it ([`Tier::seen`]) was made by that policy.
    pub(crate) live_id: AtomicU64,
    /// The names its metrics and events carry.
    pub(crate) names: Names,
    pub(crate) meter: DecisionMeter,
    /// The share of each quota the store's local fallback enforces, if it has one.
    pub(crate) local_share: Option<f64>,
    /// One change at a time, whichever handle makes it, so that the limiter's quotas and the
    /// header fields agree once every change is done.
    changing: Mutex<()>,
}

/// The policy of a tier as it is now, and the header fields that describe it.
pub(crate) struct LiveTier {
    pub(crate) policy: Policy,
    pub(crate) headers: PolicyHeaders,
    /// The fields of the policy at the local fallback's share, for its decisions.
    pub(crate) local_headers: Option<PolicyHeaders>,
    /// The policy's quotas, for the fields of a banned key's answer.
    pub(crate) rules: Box<[Rule]>,
    /// The policy this one replaced, for a decision made while the change was being made.
    previous: Option<Box<LiveTier>>,
}

impl Tier {
    /// A tier named `name` answering with `policy` until it is replaced ([`Tier::replace`]);
    /// `local_share`: the share of each quota the store's local fallback enforces, if any.
    pub(crate) fn new(
        name: Box<str>,
        policy: Policy,
        names: Names,
        meter: DecisionMeter,
        local_share: Option<f64>,
    ) -> Self {
        let live = LiveTier::new(policy, local_share);
        Tier {
            name,
            live_id: AtomicU64::new(live.headers.id()),
            live: ArcSwap::from_pointee(live),
            names,
            meter,
            local_share,
            changing: Mutex::new(()),
        }
    }

    /// The id of the policy in force, read before a decision: the same id read again once
    /// the decision is made says that no change was made meanwhile, so that the policy with
    /// that id decided it. 0 while a change is being made.
    #[inline]
    pub(crate) fn seen(&self) -> u64 {
        self.live_id.load(Ordering::SeqCst)
    }

    /// Makes `quotas` the quotas of the policy in force, once `set` has given them to the
    /// limiter; when they are not valid or `set` fails, the policy stays as it was. Changes
    /// are made one at a time, whichever handle makes them.
    ///
    /// From the start of the change to its end the id is 0, so a decision made meanwhile is
    /// told by its own quotas ([`LiveTier::previous_decided`]), not by the id, and its fields
    /// are the policy's that decided it, old or new.
    pub(crate) fn change(
        &self,
        quotas: Vec<crate::Quota>,
        set: impl FnOnce(&[crate::Quota]) -> Result<(), ConfigError>,
    ) -> Result<(), ConfigError> {
        // A change that panicked half way left valid values behind: carry on.
        let _one_at_a_time = self.changing.lock().unwrap_or_else(|e| e.into_inner());
        let mut policy = self.live.load().policy.clone();
        policy.quotas = quotas;
        policy.validate()?;
        self.live_id.store(0, Ordering::SeqCst);
        if let Err(e) = set(&policy.quotas) {
            self.live_id
                .store(self.live.load().headers.id(), Ordering::SeqCst);
            return Err(e);
        }
        let previous = Some(Box::new(self.live.load().alone()));
        let live = Arc::new(LiveTier {
            previous,
            ..LiveTier::new(policy, self.local_share)
        });
        let id = live.headers.id();
        self.live.store(live);
        self.live_id.store(id, Ordering::SeqCst);
        Ok(())
    }
}

/// The header fields of a tier's live policy, loaded: of the policy in force, or of the one
/// it replaced (`previous`).
struct LiveHeaders {
    live: arc_swap::Guard<Arc<LiveTier>>,
    previous: bool,
}

impl LiveHeaders {
    /// The fields of the policy of `tier` whose quotas decided `d`, the policy in force or
    /// the one it replaced; `id`: the id of the fields that policy has, if known.
    fn of(tier: &Tier, d: &Decision, id: u64) -> Self {
        let live = tier.live.load();
        let previous = if live.headers.id() == id {
            false
        } else if live.previous.as_ref().is_some_and(|p| p.headers.id() == id) {
            true
        } else {
            live.previous_decided(d)
        };
        LiveHeaders { live, previous }
    }

    fn tier(&self) -> &LiveTier {
        match &self.live.previous {
            Some(p) if self.previous => p,
            _ => &self.live,
        }
    }
}

impl std::ops::Deref for LiveHeaders {
    type Target = PolicyHeaders;
    fn deref(&self) -> &PolicyHeaders {
        &self.tier().headers
    }
}

impl LiveTier {
    /// `policy`, with the fields of its scaled quotas when the store has a local fallback
    /// at `local_share`.
    pub(crate) fn new(policy: Policy, local_share: Option<f64>) -> Self {
        LiveTier {
            headers: policy.headers(),
            local_headers: local_share.and_then(|s| policy.scaled_headers(s)),
            rules: policy.quotas.iter().map(crate::Quota::rule).collect(),
            policy,
            previous: None,
        }
    }

    /// This policy without the one it replaced.
    fn alone(&self) -> LiveTier {
        LiveTier {
            policy: self.policy.clone(),
            headers: self.headers.clone(),
            local_headers: self.local_headers.clone(),
            rules: self.rules.clone(),
            previous: None,
        }
    }

    /// Whether `d` was decided by the policy this one replaced rather than by this one, as
    /// far as its quotas' states tell: a GCRA quota by its interval and tolerance, a window
    /// by its limit and, first, by a reset within the window's reach. This one when both or
    /// neither could have.
    fn previous_decided(&self, d: &Decision) -> bool {
        let Some(previous) = &self.previous else {
            return false;
        };
        for strict in [true, false] {
            if decided_by(&self.rules, d, strict) {
                return false;
            }
            if decided_by(&previous.rules, d, strict) {
                return true;
            }
        }
        false
    }
}

/// Whether the states of `d` are those of a decision by `rules` (see
/// [`LiveTier::previous_decided`]); `strict`: a window's reset within its reach too.
fn decided_by(rules: &[Rule], d: &Decision, strict: bool) -> bool {
    let states = d.states();
    states.len() == rules.len()
        && states.iter().zip(rules).all(|(s, r)| {
            let (limit, reach) = match r {
                Rule::Gcra(g) => return s.gcra_figures() == Some((g.interval, g.tolerance)),
                Rule::FixedWindow(w) | Rule::SlidingLog(w) => (w.limit, w.width),
                Rule::SlidingWindow(w) => (w.limit, w.width.saturating_mul(2)),
                Rule::WarmUp(g) => (g.burst(), u64::MAX),
            };
            s.gcra_figures().is_none()
                && s.limit() == limit.min(u64::from(u32::MAX))
                && (!strict || s.reset_after_nanos() <= reach)
        })
}

/// What turns a decision into a response, whatever the store and the key: shared with the
/// futures of decisions that come later.
pub(crate) struct Answers {
    pub(crate) tiers: Box<[Tier]>,
    pub(crate) on_reject: Option<OnReject>,
    pub(crate) headers: bool,
    pub(crate) legacy_headers: bool,
    /// The status of a banned key's answer.
    pub(crate) ban_status: StatusCode,
    /// Dry-run mode and key tracing.
    pub(crate) observe: Observe,
    /// Whether a dry-run layer sends its header fields.
    pub(crate) dry_run_headers: bool,
    /// How a reservation is settled from the response, when the layer learns from responses.
    pub(crate) settle: Option<SettleRule>,
}

impl Answers {
    /// Everything after the decision of `cost` (for `key`, when the layer traces keys): an
    /// admitted request gets the decision in its extensions (`Ok`); a rejected one gets its
    /// response (`Err`), or in dry-run mode the would-be rejection in its extensions and `Ok`.
    /// A request that goes on takes the header fields of [`fields`](Self::fields) to its
    /// response, asked for where the response future is built, so that they are not moved
    /// through this answer first. `seen`: the tier's [`Tier::seen`] before the decision (0
    /// when not read), so that the fields are those of the policy that decided.
    #[inline]
    pub(crate) fn finish<ReqBody, B: From<Bytes>>(
        &self,
        tier: usize,
        decision: &Decision,
        seen: u64,
        cost: u32,
        key: Option<&dyn std::fmt::Debug>,
        req: &mut Request<ReqBody>,
    ) -> Result<(), Response<B>> {
        let tier = &self.tiers[tier];
        if decision.is_allowed() {
            let verdict = if decision.is_local() {
                Verdict::LocalAllowed
            } else if decision.is_degraded() {
                Verdict::FailOpen
            } else {
                Verdict::Allowed
            };
            tier.meter.count(verdict, None);
            crate::decision::record_admitted(req.extensions_mut(), decision);
            return Ok(());
        }
        self.rejected(tier, decision, seen, cost, key, req)
    }

    /// The header fields `decision` on tier `tier` adds to the response of a request that
    /// goes on ([`finish`](Self::finish) said `Ok`), if it adds any now; `seen` as there.
    #[inline]
    pub(crate) fn fields(
        &self,
        tier: usize,
        decision: &Decision,
        seen: u64,
    ) -> Option<RateHeaders> {
        self.fields_of(&self.tiers[tier], decision, seen)
    }

    /// The same as [`fields`](Self::fields), on the tier itself.
    #[inline]
    fn fields_of(&self, tier: &Tier, decision: &Decision, seen: u64) -> Option<RateHeaders> {
        // A decision of the failure policy knows nothing of the quotas: no fields that would
        // say otherwise. One of the local fallback is a real decision on the scaled quotas:
        // its fields say what it decided. An admission that will be settled renders its
        // fields when it is (see `Settle`); a blind one took nothing and is not settled.
        let blind = decision.is_degraded() && !decision.is_local();
        let settles = self.settle.is_some() && decision.is_allowed() && !blind;
        if blind || settles || (self.observe.dry_run && !self.dry_run_headers) {
            None
        } else {
            self.rate_headers(tier, decision, seen)
        }
    }

    /// The rejection of a request, or in dry-run mode its record.
    #[inline(never)]
    fn rejected<ReqBody, B: From<Bytes>>(
        &self,
        tier: &Tier,
        decision: &Decision,
        seen: u64,
        cost: u32,
        key: Option<&dyn std::fmt::Debug>,
        req: &mut Request<ReqBody>,
    ) -> Result<(), Response<B>> {
        let blind = decision.is_degraded() && !decision.is_local();
        let (kind, status) = match decision.outcome() {
            _ if blind => (
                RejectionKind::StoreUnavailable,
                StatusCode::SERVICE_UNAVAILABLE,
            ),
            Outcome::Exceeds => (
                RejectionKind::CostExceedsBurst,
                StatusCode::TOO_MANY_REQUESTS,
            ),
            Outcome::Banned => (RejectionKind::Banned, self.ban_status),
            _ => (RejectionKind::RateLimited, StatusCode::TOO_MANY_REQUESTS),
        };
        // The quota that fired is found only if a count or an event asks for it.
        let cost = (!blind).then_some(cost);
        let to = Recipient::of(&RequestHead::new(req));
        let r = Rejection::new(kind, status, decision.retry_after(), Some(&tier.name), to)
            .decided(decision, cost);
        let refuser = Refuser {
            names: &tier.names,
            meter: &tier.meter,
            observe: self.observe,
            hook: self.on_reject.as_ref(),
        };
        match refuser.refuse(&r, key, req.extensions_mut()) {
            None => {
                crate::decision::record_admitted(req.extensions_mut(), decision);
                Ok(())
            }
            Some(mut resp) => {
                // Rendered where they go, once the rejection is known to answer.
                if let Some(h) = self.fields_of(tier, decision, seen) {
                    h.apply(resp.headers_mut());
                }
                Err(resp)
            }
        }
    }

    /// The header fields of tier `tier` reporting `d`: the state after a settlement (none in
    /// dry-run mode unless the layer sends them there too).
    pub(crate) fn settled_headers(&self, tier: usize, d: &Decision) -> Option<RateHeaders> {
        if self.observe.dry_run && !self.dry_run_headers {
            return None;
        }
        // Made after the admission, by whichever quotas were in force then: told by its own.
        self.rate_headers(&self.tiers[tier], d, 0)
    }

    #[inline]
    fn rate_headers(&self, tier: &Tier, d: &Decision, seen: u64) -> Option<RateHeaders> {
        (self.headers || self.legacy_headers).then(|| RateHeaders::new(self, tier, d, seen))
    }
}

/// The header fields a decision adds to its response.
#[derive(Debug)]
pub(crate) struct RateHeaders {
    /// `RateLimit-Policy` and `RateLimit`.
    pub(crate) ietf: Option<(HeaderValue, HeaderValue)>,
    /// `X-RateLimit-Limit`, `-Remaining`, `-Reset`.
    pub(crate) legacy: Option<Legacy>,
}

impl RateHeaders {
    /// Adds `fields`, if any, to `response`.
    #[inline]
    pub(crate) fn apply_to<B>(fields: Option<RateHeaders>, response: &mut Response<B>) {
        if let Some(h) = fields {
            h.apply(response.headers_mut());
        }
    }

    #[inline]
    pub(crate) fn apply(self, headers: &mut HeaderMap) {
        if let Some((policy, ratelimit)) = self.ietf {
            append_fields(headers, policy, Some(ratelimit));
        }
        if let Some(legacy) = self.legacy {
            legacy.apply(headers);
        }
    }

    /// The fields of `d`, always of the policy whose quotas decided it: the one in force when
    /// the tier's id is still `seen` ([`Tier::seen`]), else the one `d`'s quotas tell.
    #[inline]
    fn new(shared: &Answers, tier: &Tier, d: &Decision, seen: u64) -> Self {
        RateHeaders {
            ietf: shared.headers.then(|| {
                let items = d.states().iter().map(|s| (s.remaining(), s.reset_after()));
                if d.is_local() {
                    // A decision of the local fallback reports the scaled quotas it decided on.
                    let live = tier.live.load();
                    if let Some(local) = &live.local_headers {
                        return (local.policy(), local.ratelimit_items(items));
                    }
                }
                let id = tier.live_id.load(Ordering::SeqCst);
                if id == seen && id != 0 {
                    crate::headers::fields(id, items, || LiveHeaders::of(tier, d, id))
                } else {
                    Self::decided_by(tier, d, items)
                }
            }),
            legacy: shared.legacy_headers.then(|| Legacy::of(d)),
        }
    }
}

impl RateHeaders {
    /// The `RateLimit-Policy` and `RateLimit` values of `d` (its `items`), made while its
    /// tier's policy may have changed: of the policy its quotas tell.
    #[cold]
    #[inline(never)]
    fn decided_by(
        tier: &Tier,
        d: &Decision,
        items: impl Iterator<Item = (u64, std::time::Duration)> + Clone,
    ) -> (HeaderValue, HeaderValue) {
        let h = LiveHeaders::of(tier, d, 0);
        (h.policy(), h.ratelimit_items(items))
    }
}

/// What an admitted request took from its key: given back if a layer inside rejects it.
pub(crate) struct Taken<B: Backend<K>, K> {
    pub(crate) limiter: B::Limiter,
    pub(crate) key: K,
    pub(crate) cost: u32,
    /// What the admission took, and where (filled in when the decision comes later).
    pub(crate) reserved: Reservation,
    /// Taken from the store's local fallback (Redis unreachable), not from the store.
    pub(crate) local: bool,
    /// When the layer settles the cost from the response: what it needs then. Boxed, so
    /// that layers that do not settle carry one word.
    pub(crate) settle: Option<Box<Settle>>,
}

/// What settling needs: the tier's rule and header fields, and the admission's decision,
/// whose fields are rendered only when the cost does not change (or the store does not
/// answer), so that a settled response renders its fields once.
pub(crate) struct Settle {
    pub(crate) answers: Arc<Answers>,
    pub(crate) tier: usize,
    /// The admission's decision; filled in when it comes later (Redis).
    pub(crate) admitted: Option<Decision>,
}

impl<B: Backend<K>, K> Taken<B, K> {
    /// What was taken, now that `decision` has come (a decision that waited): `None` when it
    /// took nothing, a degraded decision (the store down, failing open) or a rejection that a
    /// dry run lets through. One of the local fallback took from the fallback's state.
    #[inline]
    pub(crate) fn decided(mut self, decision: &Decision) -> Option<Self> {
        if !decision.is_allowed() || (decision.is_degraded() && !decision.is_local()) {
            return None;
        }
        self.local = decision.is_local();
        self.reserved = Reservation::of(decision, self.cost);
        if let Some(settle) = self.settle.as_mut() {
            settle.admitted = Some(*decision);
        }
        Some(self)
    }
}

impl Settle {
    /// The cost to charge for `response` to a request that reserved `cost` (see
    /// [`SettleRule`]), with the response given back.
    #[inline]
    pub(crate) fn actual<B>(&self, response: Response<B>, cost: u32) -> (Response<B>, u32) {
        let Some(rule) = &self.answers.settle else {
            return (response, cost);
        };
        let (parts, body) = response.into_parts();
        let actual = rule.actual(&parts, cost);
        (Response::from_parts(parts, body), actual)
    }

    /// The header fields of the admission.
    pub(crate) fn admitted_headers(&self) -> Option<RateHeaders> {
        let d = self.admitted.as_ref()?;
        self.answers.settled_headers(self.tier, d)
    }
}

#[cfg(test)]
mod tests {
    //! The fields of a decision made while its tier's policy changes are those of the quotas
    //! that decided it, and a decision made while none changes gets the same fields from the
    //! thread's cache as from the general rendering.
    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;
    use crate::observe::LayerKind;
    use crate::{Clock, Quota, RateLimiter};

    /// A quota of one kind: 0 GCRA, 1 fixed window, 2 sliding counter, 3 sliding log, 4 GCRA
    /// with warm-up; `count` per `secs` seconds.
    fn quota(kind: u8, count: u32, secs: u64) -> Quota {
        let w = Duration::from_secs(secs);
        match kind {
            0 => Quota::per_second(count).burst(count + 1),
            1 => Quota::fixed_window(count, w),
            2 => Quota::sliding_window(count, w),
            3 => Quota::sliding_log(count, w),
            _ => Quota::per_second(count).warm_up(w, 3),
        }
    }

    fn quotas() -> impl Strategy<Value = Vec<(u8, u32, u64)>> {
        proptest::collection::vec((0..5u8, 1..6u32, 1..4u64), 1..=2)
    }

    fn policy(specs: &[(u8, u32, u64)]) -> Policy {
        let mut quotas = specs.iter().map(|&(k, c, s)| quota(k, c, s));
        let mut p = Policy::new("api", quotas.next().unwrap());
        for q in quotas {
            p = p.quota(q);
        }
        p
    }

    /// The decision of a request of `cost` after `before` requests of (cost, milliseconds
    /// waited) on one key, under `policy`.
    fn decided(policy: &Policy, before: &[(u32, u64)], cost: u32) -> Decision {
        let (clock, time) = Clock::manual();
        let mut b = RateLimiter::<u8>::builder(policy.quotas[0].clone()).clock(clock);
        for q in &policy.quotas[1..] {
            b = b.quota(q.clone());
        }
        let limiter = b.build();
        for &(c, ms) in before {
            time.advance(Duration::from_millis(ms));
            let _ = limiter.check_n(&1, c);
        }
        limiter.check_n(&1, cost)
    }

    fn tier(policy: Policy) -> Tier {
        let names = Names::new(LayerKind::RateLimit, &policy.name, &policy.item_names());
        let meter = DecisionMeter::new(&names, false, &[]);
        Tier::new("api".into(), policy, names, meter, None)
    }

    fn bytes(v: &(HeaderValue, HeaderValue)) -> (Vec<u8>, Vec<u8>) {
        (v.0.as_bytes().to_vec(), v.1.as_bytes().to_vec())
    }

    fn items(d: &Decision) -> impl Iterator<Item = (u64, Duration)> + Clone + '_ {
        d.states().iter().map(|s| (s.remaining(), s.reset_after()))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2_000))]

        #[test]
        fn a_decision_made_while_the_policy_changes_gets_the_fields_of_the_quotas_that_decided_it(
            (a, b) in (1..=2usize).prop_flat_map(|n| {
                let q = proptest::collection::vec((0..5u8, 1..6u32, 1..4u64), n);
                (q.clone(), q)
            }),
            before in proptest::collection::vec((1..3u32, 0..1_500u64), 0..8),
            cost in 1..3u32,
        ) {
            let (pa, pb) = (policy(&a), policy(&b));
            let t = tier(pa.clone());
            prop_assert!(t.change(pb.quotas.clone(), |_| Ok(())).is_ok());
            let live = t.live.load();
            let old = live.previous.as_deref().unwrap();
            for (p, own, other, was_previous) in
                [(&pa, old, &**live, true), (&pb, &**live, old, false)]
            {
                let d = decided(p, &before, cost);
                // The quotas that decided always tell it, the window's reset within its reach.
                prop_assert!(decided_by(&own.rules, &d, true), "{d:?}");
                let chosen = LiveHeaders::of(&t, &d, 0);
                prop_assert!(decided_by(&chosen.tier().rules, &d, false));
                if !decided_by(&other.rules, &d, true) {
                    prop_assert_eq!(chosen.previous, was_previous);
                    prop_assert_eq!(chosen.id(), own.headers.id());
                }
            }
        }

        #[test]
        fn a_decision_made_while_no_policy_changes_gets_the_same_fields_from_the_cache(
            a in quotas(),
            before in proptest::collection::vec((1..3u32, 0..1_500u64), 0..8),
            cost in 1..3u32,
            repeat in 1..3usize,
        ) {
            let p = policy(&a);
            let t = tier(p.clone());
            let d = decided(&p, &before, cost);
            let seen = t.seen();
            for _ in 0..repeat {
                let id = t.live_id.load(Ordering::SeqCst);
                prop_assert_eq!(id, seen);
                let fast = crate::headers::fields(id, items(&d), || LiveHeaders::of(&t, &d, id));
                let general = RateHeaders::decided_by(&t, &d, items(&d));
                prop_assert_eq!(bytes(&fast), bytes(&general));
            }
        }
    }

    /// A window narrowed live, its limit kept: a request the old window decided while the
    /// change was made, whose reset is within both widths, gets the fields of the quotas in
    /// force (the handle's docs say so), since its figures fit both.
    #[test]
    fn a_decision_whose_figures_fit_both_policies_gets_the_fields_of_the_one_in_force() {
        let (old, new) = (policy(&[(1, 3, 3)]), policy(&[(1, 3, 2)]));
        let t = tier(old.clone());
        t.change(new.quotas.clone(), |_| Ok(())).unwrap();
        let d = decided(&old, &[(1, 0), (1, 1_500)], 1);
        assert_eq!(d.states()[0].reset_after(), Duration::from_millis(1_500));
        let chosen = LiveHeaders::of(&t, &d, 0);
        assert!(!chosen.previous);
        assert_eq!(chosen.id(), t.live.load().headers.id());
    }

    #[test]
    fn a_change_the_limiter_refuses_leaves_the_policy_and_its_id() {
        let t = tier(Policy::new("api", Quota::per_second(4)));
        let seen = t.seen();
        let refused = t.change(vec![Quota::per_second(8)], |_| {
            Err(ConfigError::UnknownTier("refused".into()))
        });
        assert!(refused.is_err());
        assert_eq!(t.seen(), seen);
        assert_eq!(t.live.load().policy.quotas[0], Quota::per_second(4));
        assert!(t.live.load().previous.is_none());
    }

    #[test]
    fn a_change_keeps_only_the_policy_it_replaced() {
        let t = tier(Policy::new("api", Quota::per_second(4)));
        let first = t.seen();
        for n in [8, 16] {
            t.change(vec![Quota::per_second(n)], |_| Ok(())).unwrap();
        }
        let live = t.live.load();
        let previous = live.previous.as_deref().unwrap();
        assert_eq!(previous.policy.quotas[0], Quota::per_second(8));
        assert!(previous.previous.is_none());
        assert_ne!(t.seen(), first);
        assert_eq!(t.seen(), live.headers.id());
    }

    #[test]
    fn changes_made_at_once_leave_the_fields_of_the_quotas_the_limiter_kept() {
        use std::sync::atomic::AtomicU32;
        use std::sync::Barrier;
        // The limiter: the rate of the last quotas it was given.
        let limiter = AtomicU32::new(4);
        let t = tier(Policy::new("api", Quota::per_second(4)));
        let rounds = Barrier::new(2);
        let disagreed = AtomicU32::new(0);
        std::thread::scope(|s| {
            for n in [4u32, 8] {
                let (t, limiter, rounds, disagreed) = (&t, &limiter, &rounds, &disagreed);
                s.spawn(move || {
                    for _ in 0..500 {
                        rounds.wait();
                        let set = |_: &[Quota]| {
                            limiter.store(n, Ordering::SeqCst);
                            // The other change may come in here unless changes wait their turn.
                            std::thread::yield_now();
                            Ok(())
                        };
                        t.change(vec![Quota::per_second(n)], set).unwrap();
                        // Both changes done: the fields are those of the limiter's quotas.
                        rounds.wait();
                        if n == 4 {
                            let kept = Quota::per_second(limiter.load(Ordering::SeqCst));
                            let live = t.live.load();
                            let agree =
                                live.policy.quotas[0] == kept && t.seen() == live.headers.id();
                            disagreed.fetch_add(u32::from(!agree), Ordering::SeqCst);
                        }
                        rounds.wait();
                    }
                });
            }
        });
        assert_eq!(disagreed.load(Ordering::SeqCst), 0);
    }
}
