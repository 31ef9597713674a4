//! What one quota says about one request ([`Step`], the same for every kind), and the one
//! loop that asks every quota of a policy and admits a request only if all of them do; and
//! what a key keeps in a table ([`Slot`]), read, decided and replaced as one.

use crate::decision::{Decision, Outcome, Reservation, MAX_QUOTAS};

/// The state of one quota of one key: two words, zero when never seen.
pub(crate) type Words = [u64; 2];

/// What one quota says about one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Admitted; store `words` (a log quota also appends the request to the log); the cost
    /// lands at `spot` (see [`Reservation`]).
    Allow { words: Words, spot: Words },
    /// Not now; admissible after `retry_after` nanoseconds.
    Deny { retry_after: u64 },
    /// The cost is larger than the quota's limit: no amount of waiting helps.
    Never,
}

impl Step {
    /// What a decision on one quota says of this step for a request of `cost`: its outcome,
    /// the wait of a refusal, and what an admission at a cost took (its spot in the quota).
    #[inline(always)]
    pub(crate) fn alone(&self, cost: u32) -> (Outcome, u64, Reservation) {
        let mut taken = Reservation::none();
        let (outcome, retry_after) = match *self {
            Step::Allow { spot, .. } => {
                if cost > 0 {
                    taken.cost = cost;
                    taken.spots[0] = spot;
                }
                (Outcome::Allowed, 0)
            }
            Step::Deny { retry_after } => (Outcome::Limited, retry_after),
            Step::Never => (Outcome::Exceeds, 0),
        };
        (outcome, retry_after, taken)
    }
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

/// Per-key state: what each quota of the policy needs to decide.
pub(crate) trait Slot: Send + Sync + Sized {
    /// The policy's quotas as this slot reads them.
    type Rules: ?Sized + Sync;
    /// Decides for a key that has no entry; returns the entry to insert when admitted.
    fn decide_absent(rules: &Self::Rules, now: u64, cost: u32) -> (Decision, Option<Self>);
    /// What a decision made under shared access says, as small as the slot can keep it: a
    /// table hands it out of its lock, and the decision (many words) is built from it once,
    /// where the caller keeps it, by [`decision`](Self::decision).
    type Said;
    /// Decides under shared access, atomic for the key: what [`decision`](Self::decision)
    /// turns into the decision.
    fn step(&self, rules: &Self::Rules, now: u64, cost: u32) -> Self::Said;
    /// The decision a [`step`](Self::step) said.
    fn decision(rules: &Self::Rules, said: Self::Said, now: u64, cost: u32) -> Decision;
    /// Decides under shared access; atomic for the key.
    #[inline]
    fn decide(&self, rules: &Self::Rules, now: u64, cost: u32) -> Decision {
        Self::decision(rules, self.step(rules, now, cost), now, cost)
    }
    /// Whether a table's check writes the decision where its caller keeps it
    /// ([`decide_into`](Self::decide_into)) rather than handing out what the slot
    /// [said](Self::step): for a slot whose decision is made whole under its lock, so that
    /// its many words are not copied out through the table's lookup.
    const IN_PLACE: bool = false;
    /// [`decide`](Self::decide), written into `d`.
    #[inline]
    fn decide_into(&self, rules: &Self::Rules, now: u64, cost: u32, d: &mut Decision) {
        *d = self.decide(rules, now, cost);
    }
    /// When the key becomes equal to one never seen, if nothing else happens to it.
    fn horizon(&self) -> u64;
    /// Gives back `units` of the request that took `taken`: only what still counts at `now`
    /// (see [`Reservation`]). Atomic for the key.
    fn refund(&self, rules: &Self::Rules, now: u64, taken: &Reservation, units: u32);
    /// Takes `cost` whatever the state (see [`Gcra::charged`](super::Gcra::charged)). Atomic
    /// for the key.
    fn charge(&self, rules: &Self::Rules, now: u64, cost: u32);
    /// The entry of a key without one once `cost` is taken whatever the limit.
    fn charged_absent(rules: &Self::Rules, now: u64, cost: u32) -> Self;
    /// The decision for a new key turned away because the store is full.
    fn full(rules: &Self::Rules, retry_after: u64) -> Decision;
}
