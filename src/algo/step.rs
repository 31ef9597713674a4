//! What one quota says about one request ([`Step`], the same for every kind), and the one
//! loop that asks every quota of a policy and admits a request only if all of them do.

use crate::decision::{Outcome, MAX_QUOTAS};

/// The state of one quota of one key: two words, zero when never seen.
pub(crate) type Words = [u64; 2];

/// What one quota says about one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Admitted; store `words` (a log quota also appends the request to the log); the cost
    /// lands at `spot` (see [`Reservation`](crate::decision::Reservation)).
    Allow { words: Words, spot: Words },
    /// Not now; admissible after `retry_after` nanoseconds.
    Deny { retry_after: u64 },
    /// The cost is larger than the quota's limit: no amount of waiting helps.
    Never,
}

/// What the quotas of a policy say together about one request: admitted only if every one
/// admits it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Verdict {
    /// Allowed when every quota allows; limited when one denies and none says never;
    /// exceeds when one says never.
    pub(crate) outcome: Outcome,
    /// The longest wait among the quotas that denied (0 when none did).
    pub(crate) retry_after: u64,
    /// Each quota's words to store, when every quota allowed.
    pub(crate) words: [Words; MAX_QUOTAS],
    /// Where the cost lands in each quota, when every quota allowed.
    pub(crate) spots: [Words; MAX_QUOTAS],
}

/// Asks the `n` quotas of a policy (`step(i)` for the `i`-th) about one request, all or
/// nothing: every quota is asked, so that a limited request learns the longest wait.
#[inline]
pub(crate) fn all_or_nothing(n: usize, mut step: impl FnMut(usize) -> Step) -> Verdict {
    debug_assert!(n <= MAX_QUOTAS);
    let mut v = Verdict {
        outcome: Outcome::Allowed,
        retry_after: 0,
        words: [[0; 2]; MAX_QUOTAS],
        spots: [[0; 2]; MAX_QUOTAS],
    };
    for i in 0..n.min(MAX_QUOTAS) {
        match step(i) {
            Step::Allow { words, spot } => {
                v.words[i] = words;
                v.spots[i] = spot;
            }
            Step::Deny { retry_after } => {
                if v.outcome == Outcome::Allowed {
                    v.outcome = Outcome::Limited;
                }
                v.retry_after = v.retry_after.max(retry_after);
            }
            Step::Never => v.outcome = Outcome::Exceeds,
        }
    }
    v
}
