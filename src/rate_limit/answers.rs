//! What a rate limit's decision adds to its request and its response, whatever the store and
//! the key: the tiers' live policies and their header fields, the decision in the request's
//! extensions, the rejection, and what an admission took (given back when a layer inside
//! rejects, or settled from the response). The header fields of one response are built and
//! applied here, and nowhere else.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};

use super::policy::Policy;
use super::settle::SettleRule;
use crate::algo::Rule;
use crate::decision::{Decision, Outcome, Reservation};
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
    /// The id of the live policy's header fields ([`PolicyHeaders::id`]), set after `live`:
    /// the fields a repeated decision gets come from each thread's cache of them without
    /// loading `live`.
    pub(crate) live_id: AtomicU64,
    /// The names its metrics and events carry.
    pub(crate) names: Names,
    pub(crate) meter: DecisionMeter,
    /// The share of each quota the store's local fallback enforces, if it has one.
    pub(crate) local_share: Option<f64>,
}

/// The policy of a tier as it is now, and the header fields that describe it.
pub(crate) struct LiveTier {
    pub(crate) policy: Policy,
    pub(crate) headers: PolicyHeaders,
    /// The fields of the policy at the local fallback's share, for its decisions.
    pub(crate) local_headers: Option<PolicyHeaders>,
    /// The policy's quotas, for the fields of a banned key's answer.
    pub(crate) rules: Box<[Rule]>,
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
        }
    }

    /// Replaces the policy in force, and then the id its fields are found by.
    pub(crate) fn replace(&self, policy: Policy) {
        let live = Arc::new(LiveTier::new(policy, self.local_share));
        let id = live.headers.id();
        self.live.store(live);
        self.live_id.store(id, Ordering::Release);
    }
}

/// The header fields of a tier's live policy, loaded.
struct LiveHeaders(arc_swap::Guard<Arc<LiveTier>>);

impl std::ops::Deref for LiveHeaders {
    type Target = PolicyHeaders;
    fn deref(&self) -> &PolicyHeaders {
        &self.0.headers
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
    /// admitted request gets the decision in its extensions (`Ok`); a rejected one gets its
    /// response (`Err`), or in dry-run mode the would-be rejection in its extensions and `Ok`.
    /// A request that goes on takes the header fields of [`fields`](Self::fields) to its
    /// response, asked for where the response future is built, so that they are not moved
    /// through this answer first.
    #[inline]
    pub(crate) fn finish<ReqBody, B: From<Bytes>>(
        &self,
        tier: usize,
        decision: &Decision,
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
        self.rejected(tier, decision, cost, key, req)
    }

    /// The header fields `decision` on tier `tier` adds to the response of a request that
    /// goes on ([`finish`](Self::finish) said `Ok`), if it adds any now.
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

    /// The rejection of a request, or in dry-run mode its record.
    #[inline(never)]
    fn rejected<ReqBody, B: From<Bytes>>(
        &self,
        tier: &Tier,
        decision: &Decision,
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
                if let Some(h) = self.fields_of(tier, decision) {
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

    #[inline]
    fn new(shared: &Answers, tier: &Tier, d: &Decision) -> Self {
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
                let id = tier.live_id.load(Ordering::Acquire);
                crate::headers::fields(id, items, || LiveHeaders(tier.live.load()))
            }),
            legacy: shared.legacy_headers.then(|| Legacy::of(d)),
        }
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
