//! What a full table does.

/// What a keyed limiter does with a new key when it already tracks `max_keys` keys and none of
/// them is idle.
///
/// Idle keys (whose state is that of a key never seen) are always dropped first, from the whole
/// table, which changes no decision: the policy only applies when every tracked key is active.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OnFull {
    /// Forget one active key and track the new one. The key forgotten is the one nearest to
    /// idle among a small random sample of the tracked keys (the sample is drawn with the
    /// table's secret seed, so a client cannot aim at a key). Its next request starts from a
    /// full burst, so a flood of distinct keys can loosen the limit of the least active keys by
    /// at most their burst, and never denies service to a new client. The default.
    #[default]
    EvictNearestIdle,
    /// Reject requests from new keys (as rate limited) until a tracked key goes idle; the
    /// rejection's retry time is when the first tracked key goes idle. Tracked keys keep their
    /// exact state; new clients are turned away while the table is full of active keys.
    RejectNewKeys,
}

/// A new key was refused: the table is full of active keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Full {
    /// The earliest time (table clock) at which a tracked key may be idle, `u64::MAX` when no
    /// tracked key goes idle by itself.
    pub(crate) retry_at: u64,
}

/// How many entries are compared to pick the one to evict.
pub(crate) const EVICTION_SAMPLE: usize = 8;
/// How many random buckets are probed at most to draw that sample from one shard.
pub(crate) const EVICTION_PROBES: usize = 64;
/// How many shards are tried for an eviction before giving up.
pub(crate) const EVICTION_SHARDS: usize = 4;
/// A shard is swept when it has doubled since its last sweep, once it holds this many.
pub(crate) const MIN_SWEEP: usize = 64;
/// How many survivors' idle times are kept by a sweep to choose when the next one is due.
pub(crate) const SWEEP_SAMPLE: usize = 16;
/// The least time between two sweeps of a shard that are not forced by a full table or by
/// growth (1 s): keys that go idle within moments of each request (clients slower than their
/// quota) stay tracked and take the lookup path, instead of being swept and inserted again.
pub(crate) const SWEEP_GAP: u64 = 1_000_000_000;
