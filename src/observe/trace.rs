//! The tracing events of the layers: one per rejection (or would-be rejection), and the
//! configuration of a layer when it is built.

use std::fmt::Debug;
use std::time::Duration;

use http::StatusCode;

use super::{Names, Verdict};

/// Logs a rejection at `DEBUG` (target `tollgate::reject`), or a would-be rejection of a
/// dry-run layer at `INFO` (target `tollgate::dry_run`). `key` is given only when the layer
/// traces keys; `quota`, the quota that fired, is found only when the event is logged.
#[inline]
pub(crate) fn rejected(
    names: &Names,
    quota: impl FnOnce() -> Option<usize>,
    outcome: Verdict,
    status: StatusCode,
    retry_after: Option<Duration>,
    dry_run: bool,
    key: Option<&dyn Debug>,
) {
    let enabled = if dry_run {
        tracing::enabled!(target: "tollgate::dry_run", tracing::Level::INFO)
    } else {
        tracing::enabled!(target: "tollgate::reject", tracing::Level::DEBUG)
    };
    if !enabled {
        return;
    }
    // The event itself is built out of line: rejections should not pay for its code.
    cold(|| {
        let layer = names.layer.as_str();
        let policy = &*names.policy;
        let quota = names.quota(quota()).map(|q| &**q);
        let outcome = outcome.as_str();
        let status = status.as_u16();
        let retry_after_ms = retry_after.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        // A key not traced is left out of the event (an `Option` records only when `Some`).
        let key = key.map(tracing::field::debug);
        if dry_run {
            tracing::info!(
                target: "tollgate::dry_run",
                layer, policy, quota, outcome, status, retry_after_ms, dry_run, key,
                "request would have been rejected (dry run)"
            );
        } else {
            tracing::debug!(
                target: "tollgate::reject",
                layer, policy, quota, outcome, status, retry_after_ms, dry_run, key,
                "request rejected"
            );
        }
    });
}

/// Runs `f` out of line, as code seldom run.
#[cold]
#[inline(never)]
fn cold(f: impl FnOnce()) {
    f()
}

/// Logs a layer's configuration when it is built, at `DEBUG` (target `tollgate::config`).
pub(crate) fn config(names: &Names, dry_run: bool, trace_keys: bool, settings: &dyn Debug) {
    tracing::debug!(
        target: "tollgate::config",
        layer = names.layer.as_str(),
        policy = &*names.policy,
        dry_run,
        trace_keys,
        settings = ?settings,
        "layer built"
    );
}
