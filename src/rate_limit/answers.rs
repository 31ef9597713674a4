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
    /// The live policy's generation and the id of its header fields
    /// ([`PolicyHeaders::id`]), as [`LiveTier::current`] packs them, set after `live`: a
    /// decision of that generation gets its fields from each thread's cache of them without
    /// loading `live`.
    pub(crate) current: AtomicU64,
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
    /// The generation of the limiter's quotas this policy holds ([`Decision::generation`]):
    /// 0 for the policy the limiter was built with, one more at each change.
    pub(crate) generation: u16,
    /// The policy this one replaced, for a decision its quotas judged and answered after
    /// the change; it keeps the one before it, and so on, [`KEPT`] policies in all.
    previous: Option<Box<LiveTier>>,
}

/// How many policies of a tier answer a decision by its generation: the one in force and
/// those it replaced. A decision answered after more changes than that gets the fields of
/// the policy in force.
const KEPT: usize = 8;

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
            current: AtomicU64::new(live.current()),
            live: ArcSwap::from_pointee(live),
            names,
            meter,
            local_share,
            changing: Mutex::new(()),
        }
    }

    /// Makes `quotas` the quotas of the policy in force, and `set` gives them to the
    /// limiter (`set(None)` leaves its quotas); when they are not valid or `set` fails, the
    /// policy stays as it was. Changes are made one at a time, whichever handle makes them.
    ///
    /// The limiter counts its changes ([`Decision::generation`]), and `set` says the
    /// generation it then decides with: the new policy takes the limiter's next one, is in
    /// force here before the limiter judges with its quotas, and keeps the policies it
    /// replaced ([`KEPT`] in all), so that a decision of any of their generations is answered
    /// with the fields of its own, whenever it is answered. A change made on the limiter
    /// itself, which the tier does not see, moves the limiter's count on: the next change
    /// here takes the count from the limiter again, so that the two never stay apart.
    pub(crate) fn change(
        &self,
        quotas: Vec<crate::Quota>,
        set: impl Fn(Option<&[crate::Quota]>) -> Result<u16, ConfigError>,
    ) -> Result<(), ConfigError> {
        // A change that panicked half way left valid values behind: carry on.
        let _one_at_a_time = self.changing.lock().unwrap_or_else(|e| e.into_inner());
        let old = self.live.load_full();
        let mut policy = old.policy.clone();
        policy.quotas = quotas;
        policy.validate()?;
        let next = set(None)?.wrapping_add(1);
        let live = Arc::new(LiveTier {
            generation: next,
            previous: Some(Box::new(old.kept(KEPT - 1))),
            ..LiveTier::new(policy, self.local_share)
        });
        self.publish(live.clone());
        match set(Some(&live.policy.quotas)) {
            Err(e) => {
                // The limiter kept its quotas, and judged with them throughout.
                self.publish(old);
                Err(e)
            }
            Ok(g) if g != next => {
                // A change made on the limiter itself at the same moment: the policy takes
                // the generation the limiter gave it.
                let mut again = live.kept(KEPT);
                again.generation = g;
                self.publish(Arc::new(again));
                Ok(())
            }
            Ok(_) => Ok(()),
        }
    }

    fn publish(&self, live: Arc<LiveTier>) {
        let current = live.current();
        self.live.store(live);
        self.current.store(current, Ordering::Release);
    }
}

/// The header fields of a tier's live policy, loaded: of the policy in force, or of one it
/// replaced (`back` changes before it).
struct LiveHeaders {
    live: arc_swap::Guard<Arc<LiveTier>>,
    back: usize,
}

impl LiveHeaders {
    /// The fields of the policy of `tier` whose quotas judged `d` ([`Decision::generation`]):
    /// the policy in force or one of those it replaced that it keeps ([`KEPT`] in all). A
    /// decision of an older generation still (its request answered after more changes)
    /// gets the fields of the policy in force, whose quotas may not be those that judged it.
    fn of(tier: &Tier, d: &Decision) -> Self {
        let live = tier.live.load();
        let generation = d.generation();
        let mut back = 0;
        let mut policy: &LiveTier = &live;
        while policy.generation != generation {
            match &policy.previous {
                Some(p) => {
                    policy = p;
                    back += 1;
                }
                None => {
                    back = 0;
                    break;
                }
            }
        }
        LiveHeaders { live, back }
    }

    fn tier(&self) -> &LiveTier {
        let mut policy: &LiveTier = &self.live;
        for _ in 0..self.back {
            match &policy.previous {
                Some(p) => policy = p,
                None => break,
            }
        }
        policy
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
            generation: 0,
            previous: None,
        }
    }

    /// This policy's generation and the id of its fields, in one word for [`Tier::current`].
    fn current(&self) -> u64 {
        (self.headers.id() << 16) | u64::from(self.generation)
    }

    /// This policy with the `n - 1` it replaced before it at most (`n` ≥ 1).
    fn kept(&self, n: usize) -> LiveTier {
        LiveTier {
            policy: self.policy.clone(),
            headers: self.headers.clone(),
            local_headers: self.local_headers.clone(),
            rules: self.rules.clone(),
            generation: self.generation,
            previous: match &self.previous {
                Some(p) if n > 1 => Some(Box::new(p.kept(n - 1))),
                _ => None,
            },
        }
    }
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
    /// admitted request gets the decision in its extensions and goes on (`None`); a rejected
    /// one gets its response (`Some`), or in dry-run mode the would-be rejection in its
    /// extensions and goes on. A request that goes on takes the header fields of
    /// [`fields`](Self::fields) to its response, asked for where the response future is
    /// built, so that they are not moved through this answer first.
    #[inline]
    pub(crate) fn finish<ReqBody, B: From<Bytes>>(
        &self,
        tier: usize,
        decision: &Decision,
        cost: u32,
        key: Option<&dyn std::fmt::Debug>,
        req: &mut Request<ReqBody>,
    ) -> Option<Response<B>> {
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
            return None;
        }
        self.rejected(tier, decision, cost, key, req)
    }

    /// The header fields `decision` on tier `tier` adds to the response of a request that
    /// goes on ([`finish`](Self::finish) said `None`), if it adds any now.
    #[inline]
    pub(crate) fn fields(&self, tier: usize, decision: &Decision) -> Option<RateHeaders> {
        self.fields_of(&self.tiers[tier], decision)
    }

    /// The same as [`fields`](Self::fields), on the tier itself.
    #[inline]
    fn fields_of(&self, tier: &Tier, decision: &Decision) -> Option<RateHeaders> {
        // A decision of the failure policy knows nothing of the quotas: no fields that would
        // say otherwise. One of the local fallback is a real decision on the scaled quotas:
        // its fields say what it decided. An admission that will be settled renders its
        // fields when it is (see `Settle`); a blind one took nothing and is not settled.
        let blind = decision.is_degraded() && !decision.is_local();
        let settles = self.settle.is_some() && decision.is_allowed() && !blind;
        if blind || settles || (self.observe.dry_run && !self.dry_run_headers) {
            None
        } else {
            self.rate_headers(tier, decision)
        }
    }

    /// The rejection of a request, or in dry-run mode its record (`None`).
    #[inline(never)]
    fn rejected<ReqBody, B: From<Bytes>>(
        &self,
        tier: &Tier,
        decision: &Decision,
        cost: u32,
        key: Option<&dyn std::fmt::Debug>,
        req: &mut Request<ReqBody>,
    ) -> Option<Response<B>> {
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
        // The response is built where it is returned, and its fields added there.
        let mut answer = refuser.refuse(&r, key, req.extensions_mut());
        match &mut answer {
            None => crate::decision::record_admitted(req.extensions_mut(), decision),
            Some(resp) => {
                // Rendered where they go, once the rejection is known to answer.
                if let Some(h) = self.fields_of(tier, decision) {
                    h.apply(resp.headers_mut());
                }
            }
        }
        answer
    }

    /// The header fields of tier `tier` reporting `d`: the state after a settlement (none in
    /// dry-run mode unless the layer sends them there too).
    pub(crate) fn settled_headers(&self, tier: usize, d: &Decision) -> Option<RateHeaders> {
        if self.observe.dry_run && !self.dry_run_headers {
            return None;
        }
        self.rate_headers(&self.tiers[tier], d)
    }

    #[inline]
    fn rate_headers(&self, tier: &Tier, d: &Decision) -> Option<RateHeaders> {
        (self.headers || self.legacy_headers).then(|| RateHeaders::new(self, tier, d))
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

    /// The fields of `d`, of the policy whose quotas judged it (see [`LiveHeaders::of`]):
    /// from this thread's cache when that is the policy in force.
    #[inline]
    fn new(shared: &Answers, tier: &Tier, d: &Decision) -> Self {
        RateHeaders {
            ietf: shared.headers.then(|| {
                let items = d.states().iter().map(|s| (s.remaining(), s.reset_after()));
                let current = tier.current.load(Ordering::Acquire);
                if current as u16 == d.generation() && !d.is_local() {
                    crate::headers::fields(current >> 16, items, || LiveHeaders::of(tier, d))
                } else {
                    Self::judged_by(tier, d, items)
                }
            }),
            legacy: shared.legacy_headers.then(|| Legacy::of(d)),
        }
    }
}

impl RateHeaders {
    /// The `RateLimit-Policy` and `RateLimit` values of `d` (its `items`), of a decision
    /// made by the local fallback or by quotas no longer in force: of the policy whose
    /// quotas judged it.
    #[cold]
    #[inline(never)]
    fn judged_by(
        tier: &Tier,
        d: &Decision,
        items: impl Iterator<Item = (u64, std::time::Duration)> + Clone,
    ) -> (HeaderValue, HeaderValue) {
        let h = LiveHeaders::of(tier, d);
        if d.is_local() {
            // A decision of the local fallback reports the scaled quotas it decided on.
            if let Some(local) = &h.tier().local_headers {
                return (local.policy(), local.ratelimit_items(items));
            }
        }
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
    //! The fields of a decision are those of the policy whose quotas judged it, told by the
    //! generation the limiter stamped it with, whenever it is answered; a decision of the
    //! policy in force gets the same fields from the thread's cache as from the general
    //! rendering.
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

    /// Each quota's kind, count and width in seconds (see [`quota`]).
    type Specs = Vec<(u8, u32, u64)>;

    fn quotas() -> impl Strategy<Value = Specs> {
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

    /// A limiter of `policy` on a manual clock, after `before` requests of (cost,
    /// milliseconds waited) on one key.
    fn limiter(policy: &Policy, before: &[(u32, u64)]) -> (RateLimiter<u8>, crate::ManualClock) {
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
        (limiter, time)
    }

    fn tier(policy: Policy) -> Tier {
        let names = Names::new(LayerKind::RateLimit, &policy.name, &policy.item_names());
        let meter = DecisionMeter::new(&names, false, &[]);
        Tier::new("api".into(), policy, names, meter, None)
    }

    /// Changes `t` and `limiter` to `p`, as a handle does.
    fn change(t: &Tier, limiter: &RateLimiter<u8>, p: &Policy) {
        t.change(p.quotas.clone(), |q| set(limiter, q)).unwrap();
    }

    /// What a handle's setter does to `limiter`.
    fn set(limiter: &RateLimiter<u8>, quotas: Option<&[Quota]>) -> Result<u16, ConfigError> {
        if let Some(q) = quotas {
            limiter.set_quotas(q.iter().cloned())?;
        }
        Ok(limiter.generation())
    }

    /// A limiter that only counts its changes, as a handle's setter reports them.
    fn counting(
        changes: &std::cell::Cell<u16>,
    ) -> impl Fn(Option<&[Quota]>) -> Result<u16, ConfigError> + '_ {
        move |q| {
            if q.is_some() {
                changes.set(changes.get() + 1);
            }
            Ok(changes.get())
        }
    }

    fn bytes(v: &(HeaderValue, HeaderValue)) -> (Vec<u8>, Vec<u8>) {
        (v.0.as_bytes().to_vec(), v.1.as_bytes().to_vec())
    }

    fn items(d: &Decision) -> impl Iterator<Item = (u64, Duration)> + Clone + '_ {
        d.states().iter().map(|s| (s.remaining(), s.reset_after()))
    }

    /// The id of the fields `d` gets from `t`.
    fn answered(t: &Tier, d: &Decision) -> u64 {
        LiveHeaders::of(t, d).id()
    }

    /// Two policies of the same kinds, each quota's count and width drawn apart (so that
    /// many differ in a width alone, or in nothing).
    fn two_policies() -> impl Strategy<Value = (Specs, Specs)> {
        proptest::collection::vec((0..5u8, 1..6u32, 1..4u64, 1..6u32, 1..4u64), 1..=2).prop_map(
            |v| {
                let a = v.iter().map(|&(k, c, s, _, _)| (k, c, s)).collect();
                let b = v.iter().map(|&(k, _, _, c, s)| (k, c, s)).collect();
                (a, b)
            },
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1_000))]

        #[test]
        fn a_decision_gets_the_fields_of_the_quotas_that_judged_it_whenever_it_is_answered(
            (a, b) in two_policies(),
            before in proptest::collection::vec((1..3u32, 0..1_500u64), 0..8),
            cost in 0..3u32,
        ) {
            let (pa, pb) = (policy(&a), policy(&b));
            let t = tier(pa.clone());
            let (limiter, time) = limiter(&pa, &before);
            let first = t.live.load().headers.id();
            let by_a = limiter.check_n(&1, cost);
            // Answered before the change, and after it: the fields of `a`.
            prop_assert_eq!(answered(&t, &by_a), first);
            change(&t, &limiter, &pb);
            let second = t.live.load().headers.id();
            prop_assert_eq!(answered(&t, &by_a), first);
            time.advance(Duration::from_millis(700));
            let by_b = limiter.check_n(&1, cost);
            prop_assert_eq!(answered(&t, &by_b), second);
            // Back to `a`: `b`'s decision is answered as `b`'s, and `a`'s, two changes old,
            // as `a`'s first policy.
            change(&t, &limiter, &pa);
            let third = t.live.load().headers.id();
            prop_assert_eq!(answered(&t, &by_b), second);
            prop_assert_eq!(answered(&t, &by_a), first);
            prop_assert_eq!(answered(&t, &limiter.check_n(&1, cost)), third);
            // A decision older than every policy the tier keeps gets the fields of the
            // policy in force.
            for _ in 0..KEPT - 3 {
                change(&t, &limiter, &pb);
            }
            prop_assert_eq!(answered(&t, &by_a), first);
            change(&t, &limiter, &pa);
            let last = t.live.load().headers.id();
            prop_assert_eq!(answered(&t, &by_a), last);
            prop_assert_eq!(answered(&t, &by_b), second);
        }

        #[test]
        fn a_decision_of_the_policy_in_force_gets_the_same_fields_from_the_cache(
            a in quotas(),
            before in proptest::collection::vec((1..3u32, 0..1_500u64), 0..8),
            cost in 1..3u32,
            changes in 0..3usize,
            repeat in 1..3usize,
        ) {
            let p = policy(&a);
            let t = tier(p.clone());
            let (limiter, _time) = limiter(&p, &before);
            for _ in 0..changes {
                change(&t, &limiter, &p);
            }
            let d = limiter.check_n(&1, cost);
            for _ in 0..repeat {
                let current = t.current.load(Ordering::SeqCst);
                prop_assert_eq!(current as u16, d.generation());
                let fast = crate::headers::fields(current >> 16, items(&d), || LiveHeaders::of(&t, &d));
                let general = RateHeaders::judged_by(&t, &d, items(&d));
                prop_assert_eq!(bytes(&fast), bytes(&general));
            }
        }
    }

    /// A window narrowed live, its limit kept: a request the old window judged, answered
    /// after the change, gets the old window's fields, though its figures fit both.
    #[test]
    fn a_decision_of_a_window_whose_width_alone_changed_gets_the_fields_of_its_own_width() {
        let (old, new) = (policy(&[(1, 3, 3)]), policy(&[(1, 3, 2)]));
        let t = tier(old.clone());
        let (limiter, _time) = limiter(&old, &[(1, 0), (1, 1_500)]);
        let d = limiter.check(&1);
        assert_eq!(d.states()[0].reset_after(), Duration::from_millis(1_500));
        change(&t, &limiter, &new);
        let chosen = LiveHeaders::of(&t, &d);
        assert_eq!(chosen.back, 1);
        assert_eq!(chosen.policy().to_str().unwrap(), r#""api";q=3;w=3"#);
        let after = limiter.check(&1);
        assert_eq!(
            LiveHeaders::of(&t, &after).policy().to_str().unwrap(),
            r#""api";q=3;w=2"#
        );
    }

    #[test]
    fn a_change_the_limiter_refuses_leaves_the_policy_and_its_generation() {
        let t = tier(Policy::new("api", Quota::per_second(4)));
        let current = t.current.load(Ordering::SeqCst);
        let refused = t.change(vec![Quota::per_second(8)], |q| match q {
            Some(_) => Err(ConfigError::UnknownTier("refused".into())),
            None => Ok(0),
        });
        assert!(refused.is_err());
        assert_eq!(t.current.load(Ordering::SeqCst), current);
        assert_eq!(t.live.load().policy.quotas[0], Quota::per_second(4));
        assert_eq!(t.live.load().generation, 0);
        assert!(t.live.load().previous.is_none());
    }

    #[test]
    fn a_change_keeps_the_policies_it_replaced_up_to_kept_in_all() {
        let t = tier(Policy::new("api", Quota::per_second(4)));
        let first = t.current.load(Ordering::SeqCst);
        let changes = std::cell::Cell::new(0);
        for n in 5..5 + KEPT as u32 + 2 {
            t.change(vec![Quota::per_second(n)], counting(&changes))
                .unwrap();
        }
        let live = t.live.load();
        let mut kept = vec![];
        let mut policy: Option<&LiveTier> = Some(&live);
        while let Some(p) = policy {
            kept.push((p.generation, p.policy.quotas[0].clone()));
            policy = p.previous.as_deref();
        }
        let top = KEPT as u16 + 2;
        let expect: Vec<_> = (0..KEPT as u16)
            .map(|back| (top - back, Quota::per_second(u32::from(top - back) + 4)))
            .collect();
        assert_eq!(kept, expect);
        assert_ne!(t.current.load(Ordering::SeqCst), first);
        assert_eq!(t.current.load(Ordering::SeqCst), live.current());
    }

    /// Quotas set on the limiter itself, which the tier does not see, put the limiter's
    /// count ahead of the tier's; the next change through the tier takes the limiter's count
    /// again, so that each later decision is answered with the policy that judged it, and a
    /// decision of the quotas the tier never saw with the policy in force.
    #[test]
    fn a_change_made_on_the_limiter_itself_leaves_the_tier_in_step_at_its_next_change() {
        let (p0, p1, p2) = (
            policy(&[(0, 4, 1)]),
            policy(&[(0, 8, 1)]),
            policy(&[(0, 16, 1)]),
        );
        let t = tier(p0.clone());
        let (limiter, _time) = limiter(&p0, &[]);
        let ids = |t: &Tier| t.live.load().headers.id();
        for direct in [1, 2, 3] {
            for _ in 0..direct {
                limiter.set_quotas([Quota::per_second(5)]).unwrap();
            }
            let unseen = limiter.check(&1);
            assert_eq!(answered(&t, &unseen), ids(&t), "the policy in force");
            change(&t, &limiter, &p1);
            let first = ids(&t);
            let by_p1 = limiter.check(&1);
            assert_eq!(answered(&t, &by_p1), first);
            change(&t, &limiter, &p2);
            assert_eq!(
                answered(&t, &by_p1),
                first,
                "after {direct} change(s) on the limiter"
            );
            assert_eq!(answered(&t, &limiter.check(&1)), ids(&t));
            assert_eq!(answered(&t, &unseen), ids(&t), "the policy in force");
            change(&t, &limiter, &p0);
        }
    }

    /// Generations are 16-bit and wrap: past 65 536 changes, each shape of policy still
    /// stamps its decisions with the generation the limiter reports, and the tier answers a
    /// decision of a kept policy, one of them on each side of the wrap, with that policy.
    #[test]
    fn decisions_keep_their_policy_across_the_wrap_of_the_generation() {
        // One GCRA quota, two GCRA quotas, one window quota, and kinds mixed with a log.
        for specs in [
            vec![(0, 4, 1)],
            vec![(0, 4, 1), (0, 9, 1)],
            vec![(1, 4, 1)],
            vec![(2, 4, 2), (3, 5, 1)],
        ] {
            let p0 = policy(&specs);
            let t = tier(p0.clone());
            let (limiter, _time) = limiter(&p0, &[]);
            // Changed on the limiter itself up to one change before the wrap.
            for _ in 0..u16::MAX - 1 {
                limiter.set_quotas(p0.quotas.iter().cloned()).unwrap();
            }
            assert_eq!(limiter.generation(), u16::MAX - 1);
            let mut kept = vec![];
            for round in 0..4u32 {
                let mut p = p0.clone();
                p.quotas[0] = quota(specs[0].0, 10 + round, specs[0].2);
                change(&t, &limiter, &p);
                let d = limiter.check(&1);
                assert_eq!(d.generation(), limiter.generation(), "{specs:?} {round}");
                kept.push((d, t.live.load().headers.id()));
            }
            assert_eq!(limiter.generation(), 2, "the wrap was passed");
            for (d, id) in &kept {
                assert_eq!(answered(&t, d), *id, "{specs:?} {}", d.generation());
            }
        }
    }

    #[test]
    fn changes_made_at_once_leave_the_fields_of_the_quotas_the_limiter_kept() {
        use std::sync::atomic::AtomicU32;
        use std::sync::Barrier;
        // The limiter: the rate of the last quotas it was given.
        let limiter = AtomicU32::new(4);
        let changes = std::sync::atomic::AtomicU16::new(0);
        let t = tier(Policy::new("api", Quota::per_second(4)));
        let rounds = Barrier::new(2);
        let disagreed = AtomicU32::new(0);
        std::thread::scope(|s| {
            for n in [4u32, 8] {
                let (t, limiter, rounds, disagreed) = (&t, &limiter, &rounds, &disagreed);
                let changes = &changes;
                s.spawn(move || {
                    for _ in 0..500 {
                        rounds.wait();
                        let set = |q: Option<&[Quota]>| {
                            if q.is_some() {
                                limiter.store(n, Ordering::SeqCst);
                                // The other change may come in here unless changes wait
                                // their turn.
                                std::thread::yield_now();
                                changes.fetch_add(1, Ordering::SeqCst);
                            }
                            Ok(changes.load(Ordering::SeqCst))
                        };
                        t.change(vec![Quota::per_second(n)], set).unwrap();
                        // Both changes done: the fields are those of the limiter's quotas.
                        rounds.wait();
                        if n == 4 {
                            let kept = Quota::per_second(limiter.load(Ordering::SeqCst));
                            let live = t.live.load();
                            let agree = live.policy.quotas[0] == kept
                                && t.current.load(Ordering::SeqCst) == live.current();
                            disagreed.fetch_add(u32::from(!agree), Ordering::SeqCst);
                        }
                        rounds.wait();
                    }
                });
            }
        });
        assert_eq!(disagreed.load(Ordering::SeqCst), 0);
    }

    /// A request that goes on carries the decision that judged it to its handler: its
    /// admission, and in dry run the refusal that let it through; a rejected one reaches no
    /// handler. The answer of a decision says which (`Answers::finish`).
    #[tokio::test(start_paused = true)]
    async fn a_request_that_goes_on_carries_the_decision_that_judged_it_admitted_or_let_through() {
        use tower::{Layer, ServiceExt};

        let handler = tower::service_fn(|req: Request<()>| async move {
            let d = req.extensions().get::<Decision>().copied();
            let seen = d.map(|d| (d.is_allowed(), d.remaining()));
            Ok::<_, std::convert::Infallible>(Response::new(Bytes::from(format!("{seen:?}"))))
        });
        for dry_run in [false, true] {
            let (clock, _time) = Clock::manual();
            let layer = crate::RateLimitLayer::new(Quota::per_second(1).burst(2))
                .clock(clock)
                .dry_run(dry_run);
            let mut answers = Vec::new();
            for _ in 0..3 {
                let resp = layer
                    .clone()
                    .layer(handler)
                    .oneshot(Request::new(()))
                    .await
                    .unwrap();
                answers.push((resp.status().as_u16(), resp.into_body()));
            }
            let third = match dry_run {
                // The default rejection: the handler never saw it.
                false => (429, Bytes::from("Too Many Requests\n")),
                true => (200, Bytes::from("Some((false, 0))")),
            };
            assert_eq!(
                answers,
                [
                    (200, Bytes::from("Some((true, 1))")),
                    (200, Bytes::from("Some((true, 0))")),
                    third,
                ],
                "dry run {dry_run}"
            );
        }
    }
}
