//! The one rejection path of every layer: a built [`Rejection`] is counted, traced, recorded
//! in the request's extensions in dry-run mode, or answered.
//!
//! The rate limit, the concurrency limit and the shaping layer each build the [`Rejection`]
//! of what they refused (its kind, status, wait, policy name, and for a rate limit the
//! decision and the quota that fired) and hand it to [`Refuser::refuse`]; what differs between
//! them is only the header fields they add to the response it returns.

use std::fmt::Debug;

use bytes::Bytes;
use http::{Extensions, Response};

use super::{reject, OnReject, Rejection};
use crate::decision::Outcome;
use crate::observe::{self, DecisionMeter, DryRunRejection, Names, Observe, Verdict};

/// What one layer (or one tier of a rate limit) counts, traces and answers its rejections
/// with.
pub(crate) struct Refuser<'a> {
    /// The names its metrics, events and dry-run records carry.
    pub(crate) names: &'a Names,
    pub(crate) meter: &'a DecisionMeter,
    /// Dry-run mode and key tracing.
    pub(crate) observe: Observe,
    /// The layer's rejection hook, if it has one.
    pub(crate) hook: Option<&'a OnReject>,
}

impl Refuser<'_> {
    /// Counts `r` and traces it (with `key`, when the layer traces keys). In dry-run mode the
    /// would-be rejection is recorded in `ext`, the request's extensions, and the request goes
    /// on (`None`); otherwise the response, the hook's or the default one, marked when a layer
    /// outside decided the request.
    #[inline]
    pub(crate) fn refuse<B: From<Bytes>>(
        &self,
        r: &Rejection<'_>,
        key: Option<&dyn Debug>,
        ext: &mut Extensions,
    ) -> Option<Response<B>> {
        let verdict = verdict(r);
        let dry_run = self.observe.dry_run;
        self.meter.count_with(verdict, || r.quota());
        let key = key.filter(|_| self.observe.trace_keys);
        observe::rejected(
            self.names,
            || r.quota(),
            verdict,
            r.status,
            r.retry_after,
            dry_run,
            key,
        );
        if dry_run {
            let record =
                DryRunRejection::new(self.names, r.quota(), r.kind, r.status, r.retry_after);
            record.record(ext);
            return None;
        }
        Some(reject(self.hook, r, r.outer))
    }
}

/// The outcome a rejection is counted as: a rate limit of a store's local fallback is its
/// own, every other follows the kind.
fn verdict(r: &Rejection<'_>) -> Verdict {
    match r.decision {
        Some(d) if d.outcome() == Outcome::Limited && d.is_local() => Verdict::LocalLimited,
        _ => Verdict::of_rejection(r.kind),
    }
}
