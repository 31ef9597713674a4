//! What every service of one [`RateLimitLayer`](super::RateLimitLayer) shares: its limiters,
//! the closures that pick tier, cost and skips, and everything done before a decision. What is
//! done after it is in [`answers`](super::answers).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};

use super::answers::{Answers, Settle, Taken};
use crate::decision::{Decision, Reservation};
use crate::key::missing::Resolved;
use crate::key::{KeyExtractor, RequestHead};
use crate::layer::common::Core;
use crate::observe::Verdict;
use crate::penalty::{self, Penalties};
use crate::response::{Recipient, Rejection, RejectionKind};

/// Chooses a request's tier: given the request and a lookup of tier names, the tier's index.
pub(crate) type SelectFn =
    dyn Fn(&RequestHead<'_>, &dyn Fn(&str) -> Option<usize>) -> Option<usize> + Send + Sync;
/// The cost of a request.
pub(crate) type CostFn = dyn Fn(&RequestHead<'_>) -> u32 + Send + Sync;
/// Whether a request goes through uncounted.
pub(crate) type SkipFn = dyn Fn(&RequestHead<'_>) -> bool + Send + Sync;

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

/// What a layer builds the state its services share from ([`Shared::new`]); `L` is the
/// limiter type of the layer's store.
pub(crate) struct Parts<E: KeyExtractor, L> {
    pub(crate) core: Core<E>,
    /// One limiter per tier, in the order of `answers.tiers`.
    pub(crate) limiters: Box<[L]>,
    pub(crate) answers: Arc<Answers>,
    pub(crate) select: Option<Arc<SelectFn>>,
    pub(crate) cost: Option<Arc<CostFn>>,
    pub(crate) skip: Option<Arc<SkipFn>>,
    pub(crate) skip_methods: Box<[Method]>,
    pub(crate) skip_paths: Box<[String]>,
    /// The penalty box, when the layer keeps it in memory (see `Backend::LOCAL_PENALTIES`).
    pub(crate) penalty: Option<Penalties<E::Key>>,
}

/// Everything a layer's services share; `L` is the limiter type of the layer's store.
pub(crate) struct Shared<E: KeyExtractor, L> {
    /// What the layer built.
    parts: Parts<E, L>,
    /// Whether an unknown tier name from the selector has been logged.
    unknown_tier_logged: AtomicBool,
    /// Whether the layer has any skip rule: most have none, and then no request is read for
    /// them.
    skipping: bool,
}

/// What a request needs before the store is asked.
pub(crate) enum Prepared<K> {
    /// Not limited: call the inner service as it is.
    Pass,
    /// No key, and the layer rejects such requests with `status` (see [`Shared::missing`]).
    Missing { tier: usize, status: StatusCode },
    /// Decide `cost` for `key` on the tier at index `tier`.
    Decide { tier: usize, key: K, cost: u32 },
}

impl<E: KeyExtractor, L> Shared<E, L> {
    /// The shared state of a layer's services, built from `parts`.
    pub(crate) fn new(parts: Parts<E, L>) -> Self {
        Shared {
            skipping: !parts.skip_methods.is_empty()
                || !parts.skip_paths.is_empty()
                || parts.skip.is_some(),
            parts,
            unknown_tier_logged: AtomicBool::new(false),
        }
    }

    /// What turns a decision into a response, shared with the futures of later decisions.
    #[inline]
    pub(crate) fn answers(&self) -> &Arc<Answers> {
        &self.parts.answers
    }

    /// One limiter per tier, in the order of the tiers.
    #[inline]
    pub(crate) fn limiters(&self) -> &[L] {
        &self.parts.limiters
    }

    /// The penalty box, when the layer keeps it in memory.
    pub(crate) fn penalties(&self) -> Option<&Penalties<E::Key>> {
        self.parts.penalty.as_ref()
    }

    /// Whether an admission of `cost` is settled from its response ([`Answers::settle`]).
    #[inline]
    pub(crate) fn settles(&self) -> bool {
        self.parts.answers.settle.is_some()
    }

    /// The key as rejection events show it: only when the layer traces keys.
    #[inline]
    pub(crate) fn traced<'k>(&self, key: &'k E::Key) -> Option<&'k dyn std::fmt::Debug> {
        self.parts.core.traced(key)
    }

    #[inline]
    fn skips(&self, head: &RequestHead<'_>) -> bool {
        self.skipping && self.skipped(head)
    }

    fn skipped(&self, head: &RequestHead<'_>) -> bool {
        self.parts.skip_methods.contains(head.method)
            || self.parts.skip_paths.iter().any(|p| p == head.uri.path())
            || self.parts.skip.as_ref().is_some_and(|f| f(head))
    }

    fn tier(&self, head: &RequestHead<'_>) -> usize {
        let Some(select) = &self.parts.select else {
            return 0;
        };
        let find = |name: &str| {
            let found = self
                .parts
                .answers
                .tiers
                .iter()
                .position(|t| &*t.name == name);
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
            let known: Vec<&str> = self.parts.answers.tiers.iter().map(|t| &*t.name).collect();
            tracing::error!(
                tier = name,
                ?known,
                "tollgate: select_tier chose a tier the layer does not have; such requests get \
                 the default policy (logged once per layer)"
            );
        }
    }

    /// Skip rules, tier, key and cost of a request: everything before the decision.
    #[inline(always)]
    pub(crate) fn prepare(&self, head: &RequestHead<'_>) -> Prepared<E::Key> {
        if self.skips(head) {
            return Prepared::Pass;
        }
        let tier = self.tier(head);
        let key = match self.parts.core.resolve(head) {
            Resolved::Key(key) => key,
            Resolved::Pass => return Prepared::Pass,
            Resolved::Reject(status) => return Prepared::Missing { tier, status },
        };
        let cost = self.parts.cost.as_ref().map_or(1, |f| f(head));
        Prepared::Decide { tier, key, cost }
    }

    /// The rejection of a request without a key on tier `tier`, with `status`; in dry-run
    /// mode its record, and the request goes on (`None`).
    #[cold]
    pub(crate) fn missing<ReqBody, B: From<Bytes>>(
        &self,
        tier: usize,
        status: StatusCode,
        req: &mut Request<ReqBody>,
    ) -> Option<Response<B>> {
        let t = &self.parts.answers.tiers[tier];
        let to = Recipient::of(&RequestHead::new(req));
        let r = Rejection::new(RejectionKind::MissingKey, status, None, Some(&t.name), to);
        self.parts
            .core
            .refuser(&t.names, &t.meter)
            .refuse(&r, None, req.extensions_mut())
    }

    /// The decision for `key` if the penalty box bans it now, before the quotas are asked.
    /// Most layers have no penalty box: that is read here, where the request is decided,
    /// and the box is asked out of line.
    #[inline(always)]
    pub(crate) fn banned(&self, tier: usize, key: &E::Key) -> Option<Decision> {
        let penalty = self.parts.penalty.as_ref()?;
        self.banned_by(penalty, tier, key)
    }

    #[inline(never)]
    fn banned_by(
        &self,
        penalty: &Penalties<E::Key>,
        tier: usize,
        key: &E::Key,
    ) -> Option<Decision> {
        match penalty.wait_at(key, penalty.now()) {
            0 => None,
            wait => Some(banned(&self.parts.answers.tiers[tier], wait)),
        }
    }

    /// A refusal the key's own traffic caused is a strike against it (see
    /// [`penalty::is_offence`]): `decision` becomes the ban's if this strike (or one racing
    /// it) banned the key. A dry run records no strikes.
    /// Without a penalty box (most layers) nothing is called.
    #[inline(always)]
    pub(crate) fn strike(&self, tier: usize, key: &E::Key, decision: &mut Decision) {
        if let Some(penalty) = &self.parts.penalty {
            self.strike_by(penalty, tier, key, decision);
        }
    }

    #[inline(never)]
    fn strike_by(
        &self,
        penalty: &Penalties<E::Key>,
        tier: usize,
        key: &E::Key,
        decision: &mut Decision,
    ) {
        if !penalty::is_offence(decision) || self.parts.answers.observe.dry_run {
            return;
        }
        let retry = decision.retry_after().map_or(0, penalty::nanos);
        match penalty.strike_at(key, penalty.now(), retry).1 {
            0 => {}
            wait => *decision = banned(&self.parts.answers.tiers[tier], wait),
        }
    }
}

impl<E: KeyExtractor, L: Clone> Shared<E, L> {
    /// Whether an admitted request of `cost` holds something to give back or settle later.
    #[inline]
    pub(crate) fn reserves(&self, cost: u32) -> bool {
        cost > 0 || self.parts.answers.settle.is_some()
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
        B: crate::store::backend::Backend<E::Key, Limiter = L>,
    {
        Taken {
            limiter: self.parts.limiters[tier].clone(),
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
            settle: self.parts.answers.settle.is_some().then(|| {
                Box::new(Settle {
                    answers: self.parts.answers.clone(),
                    tier,
                    admitted: admitted.copied(),
                })
            }),
        }
    }
}

/// The decision of a key banned for `wait` nanoseconds more, on the quotas of `tier`'s policy
/// in force, whose generation answers it.
fn banned(tier: &super::answers::Tier, wait: u64) -> Decision {
    let live = tier.live.load();
    Decision::banned(&live.rules, wait).stamped(live.generation)
}
