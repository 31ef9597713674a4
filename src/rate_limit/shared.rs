//! What every service of one [`RateLimitLayer`](super::RateLimitLayer) shares: its tiers, the
//! closures that pick tier, cost and skips, and everything done before and after a decision.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};

use super::future::{RateHeaders, Settle, Taken};
use super::policy::Policy;
use super::settle::SettleRule;
use crate::algo::Rule;
use crate::decision::{Decision, Outcome, Reservation};
use crate::headers::PolicyHeaders;
use crate::key::missing::Resolved;
use crate::key::{KeyExtractor, RequestHead};
use crate::layer::common::Core;
use crate::observe::{self, DecisionMeter, DryRunRejection, Names, Observe, Verdict};
use crate::penalty::{self, banned_decision, Penalties};
use crate::response::{self, OnReject, Recipient, RejectionKind};

/// Chooses a request's tier: given the request and a lookup of tier names, the tier's index.
pub(crate) type SelectFn =
    dyn Fn(&RequestHead<'_>, &dyn Fn(&str) -> Option<usize>) -> Option<usize> + Send + Sync;
/// The cost of a request.
pub(crate) type CostFn = dyn Fn(&RequestHead<'_>) -> u32 + Send + Sync;
/// Whether a request goes through uncounted.
pub(crate) type SkipFn = dyn Fn(&RequestHead<'_>) -> bool + Send + Sync;

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

/// The outcomes a rate-limit policy can count.
pub(crate) const OUTCOMES: &[Verdict] = &[
    Verdict::Allowed,
    Verdict::MissingKey,
    Verdict::Banned,
    #[cfg(feature = "redis")]
    Verdict::FailOpen,
    #[cfg(feature = "redis")]
    Verdict::FailClosed,
    #[cfg(feature = "redis")]
    Verdict::LocalAllowed,
    #[cfg(feature = "redis")]
    Verdict::LocalLimited,
];

/// Everything a layer's services share; `L` is the limiter type of the layer's store.
pub(crate) struct Shared<E: KeyExtractor, L> {
    pub(crate) core: Core<E>,
    /// One limiter per tier, in the order of `answers.tiers`.
    pub(crate) limiters: Box<[L]>,
    pub(crate) answers: Arc<Answers>,
    pub(crate) select: Option<Arc<SelectFn>>,
    pub(crate) cost: Option<Arc<CostFn>>,
    pub(crate) skip: Option<Arc<SkipFn>>,
    pub(crate) skip_methods: Box<[Method]>,
    pub(crate) skip_paths: Box<[String]>,
    /// Whether an unknown tier name from the selector has been logged.
    pub(crate) unknown_tier_logged: AtomicBool,
    /// The penalty box, when the layer keeps it in memory (see `Backend::LOCAL_PENALTIES`).
    pub(crate) penalty: Option<Penalties<E::Key>>,
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

/// What a request needs before the store is asked.
pub(crate) enum Prepared<K, B> {
    /// Not limited: call the inner service as it is.
    Pass,
    /// Answered without a decision (no key, and the layer rejects such requests).
    Reject(Response<B>),
    /// Would have been answered without a decision, but the layer runs dry.
    Shadow(DryRunRejection),
    /// Decide `cost` for `key` on the tier at index `tier`.
    Decide { tier: usize, key: K, cost: u32 },
}

impl<E: KeyExtractor, L> Shared<E, L> {
    fn skips(&self, head: &RequestHead<'_>) -> bool {
        self.skip_methods.contains(head.method)
            || self.skip_paths.iter().any(|p| p == head.uri.path())
            || self.skip.as_ref().is_some_and(|f| f(head))
    }

    fn tier(&self, head: &RequestHead<'_>) -> usize {
        let Some(select) = &self.select else {
            return 0;
        };
        let find = |name: &str| {
            let found = self.answers.tiers.iter().position(|t| &*t.name == name);
            if found.is_none() {
                self.unknown_tier(name);
            }
            found
        };
        select(head, &find).unwrap_or(0)
    }

    /// A selector named a tier the layer does not have: the request gets the default policy,
    /// and the first time the name is logged, since it is a configuration mistake.
    #[cold]
    fn unknown_tier(&self, name: &str) {
        if !self.unknown_tier_logged.swap(true, Ordering::Relaxed) {
            let known: Vec<&str> = self.answers.tiers.iter().map(|t| &*t.name).collect();
            tracing::error!(
                tier = name,
                ?known,
                "tollgate: select_tier chose a tier the layer does not have; such requests get \
                 the default policy (logged once per layer)"
            );
        }
    }

    /// Skip rules, tier, key and cost of a request: everything before the decision.
    #[inline]
    pub(crate) fn prepare<B: From<Bytes>>(&self, head: &RequestHead<'_>) -> Prepared<E::Key, B> {
        if self.skips(head) {
            return Prepared::Pass;
        }
        let tier = self.tier(head);
        let key = match self.core.resolve(head) {
            Resolved::Key(key) => key,
            Resolved::Pass => return Prepared::Pass,
            Resolved::Reject(status) => {
                let t = &self.answers.tiers[tier];
                let dry_run = self.core.observe.dry_run;
                t.meter.count(Verdict::MissingKey, None);
                observe::rejected(
                    &t.names,
                    None,
                    Verdict::MissingKey,
                    status,
                    None,
                    dry_run,
                    None,
                );
                if dry_run {
                    let kind = RejectionKind::MissingKey;
                    return Prepared::Shadow(DryRunRejection::new(
                        &t.names, None, kind, status, None,
                    ));
                }
                let policy = Some(&*t.name);
                let to = Recipient::of(head);
                return Prepared::Reject(self.core.reject_missing(status, policy, to));
            }
        };
        let cost = self.cost.as_ref().map_or(1, |f| f(head));
        Prepared::Decide { tier, key, cost }
    }

    /// The decision for `key` if the penalty box bans it now, before the quotas are asked.
    #[inline]
    pub(crate) fn banned(&self, tier: usize, key: &E::Key) -> Option<Decision> {
        let penalty = self.penalty.as_ref()?;
        match penalty.wait_at(key, penalty.now()) {
            0 => None,
            wait => Some(banned_decision(
                &self.answers.tiers[tier].live.load().rules,
                wait,
            )),
        }
    }

    /// A refusal the key's own traffic caused is a strike against it (see
    /// [`penalty::is_offence`]): `decision` becomes the ban's if this strike (or one racing
    /// it) banned the key. A dry run records no strikes.
    #[inline]
    pub(crate) fn strike(&self, tier: usize, key: &E::Key, decision: &mut Decision) {
        let Some(penalty) = &self.penalty else {
            return;
        };
        if !penalty::is_offence(decision) || self.answers.observe.dry_run {
            return;
        }
        let retry = decision.retry_after().map_or(0, penalty::nanos);
        match penalty.strike_at(key, penalty.now(), retry).1 {
            0 => {}
            wait => *decision = banned_decision(&self.answers.tiers[tier].live.load().rules, wait),
        }
    }
}

impl<E: KeyExtractor, L: Clone> Shared<E, L> {
    /// Whether an admitted request of `cost` holds something to give back or settle later.
    #[inline]
    pub(crate) fn reserves(&self, cost: u32) -> bool {
        cost > 0 || self.answers.settle.is_some()
    }

    /// What an admitted request of `cost` took from `key` on tier `tier`, with `admitted`,
    /// the decision that admitted it (`None` while it is to come).
    #[inline]
    pub(crate) fn taken<B>(
        &self,
        tier: usize,
        key: E::Key,
        cost: u32,
        admitted: Option<&Decision>,
    ) -> Taken<B, E::Key>
    where
        B: super::store::Backend<E::Key, Limiter = L>,
    {
        Taken {
            limiter: self.limiters[tier].clone(),
            key,
            cost,
            reserved: match &admitted {
                Some(d) => Reservation::of(d, cost),
                None => Reservation {
                    cost,
                    ..Reservation::none()
                },
            },
            local: admitted.is_some_and(|d| d.is_local()),
            settle: self.answers.settle.is_some().then(|| {
                Box::new(Settle {
                    answers: self.answers.clone(),
                    tier,
                    admitted: admitted.copied(),
                })
            }),
        }
    }
}

impl Answers {
    /// Everything after the decision of `cost` (for `key`, when the layer traces keys): an
    /// admitted request gets the decision in its extensions and the header fields for its
    /// response (`Ok`); a rejected one gets its response (`Err`), or in dry-run mode the
    /// would-be rejection in its extensions and `Ok`.
    #[inline]
    pub(crate) fn finish<ReqBody, B: From<Bytes>>(
        &self,
        tier: usize,
        decision: &Decision,
        cost: u32,
        key: Option<&dyn std::fmt::Debug>,
        req: &mut Request<ReqBody>,
    ) -> Result<Option<RateHeaders>, Response<B>> {
        let tier = &self.tiers[tier];
        let dry_run = self.observe.dry_run;
        // A decision of the failure policy knows nothing of the quotas: no fields that would
        // say otherwise. One of the local fallback is a real decision on the scaled quotas:
        // its fields say what it decided. An admission that will be settled renders its
        // fields when it is (see `Settle`); a blind one took nothing and is not settled.
        let blind = decision.is_degraded() && !decision.is_local();
        let settles = self.settle.is_some() && decision.is_allowed() && !blind;
        let headers = if blind || settles || (dry_run && !self.dry_run_headers) {
            None
        } else {
            self.rate_headers(tier, decision)
        };
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
            return Ok(headers);
        }
        self.rejected(tier, decision, cost, key, req, headers)
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
        headers: Option<RateHeaders>,
    ) -> Result<Option<RateHeaders>, Response<B>> {
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
        let quota = if blind {
            None
        } else {
            observe::fired(decision, cost)
        };
        let verdict = match decision.outcome() {
            Outcome::Limited if decision.is_local() => Verdict::LocalLimited,
            _ => Verdict::of_rejection(kind),
        };
        let retry_after = decision.retry_after();
        let dry_run = self.observe.dry_run;
        tier.meter.count(verdict, quota);
        observe::rejected(
            &tier.names,
            quota,
            verdict,
            status,
            retry_after,
            dry_run,
            key,
        );
        if dry_run {
            let r = DryRunRejection::new(&tier.names, quota, kind, status, retry_after);
            r.record(req.extensions_mut());
            crate::decision::record_admitted(req.extensions_mut(), decision);
            return Ok(headers);
        }
        let mut resp = response::respond(
            self.on_reject.as_ref(),
            kind,
            status,
            decision.retry_after(),
            Some(decision),
            Some(&tier.name),
            Recipient::of(&RequestHead::new(req)),
        );
        if let Some(h) = headers {
            h.apply(resp.headers_mut());
        }
        Err(resp)
    }

    /// The header fields of tier `tier` reporting `d`: the state after a settlement (none in
    /// dry-run mode unless the layer sends them there too).
    pub(crate) fn settled_headers(&self, tier: usize, d: &Decision) -> Option<RateHeaders> {
        if self.observe.dry_run && !self.dry_run_headers {
            return None;
        }
        self.rate_headers(&self.tiers[tier], d)
    }

    fn rate_headers(&self, tier: &Tier, d: &Decision) -> Option<RateHeaders> {
        (self.headers || self.legacy_headers).then(|| RateHeaders::new(self, tier, d))
    }
}

impl RateHeaders {
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
            legacy: shared.legacy_headers.then(|| crate::headers::Legacy::of(d)),
        }
    }
}
