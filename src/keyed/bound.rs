//! What a full table does, and the bound several tables may share.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, Weak};

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
    /// For a while after a live widening of a sliding window or log, the table judges idleness
    /// behind the clock by the widening (a key written by a check racing the change must not
    /// be dropped early), so a new key may be turned away up to that much longer; the retry
    /// time it is given includes it.
    RejectNewKeys,
}

/// A new key was refused: the table is full of active keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Full {
    /// The earliest time (table clock) at which a key this table tracks may be idle,
    /// `u64::MAX` when none goes idle by itself.
    pub(crate) retry_at: u64,
    /// Nanoseconds from the refusal until a key of another table sharing the bound may be
    /// idle, read on that table's clock (`u64::MAX`: none). Kept apart from `retry_at`,
    /// which is a time of this table: a table may sweep behind the clock for a while.
    pub(crate) elsewhere: u64,
}

/// Entries of this rank or lower give way to any new key under
/// [`OnFull::EvictNearestIdle`]; an entry of a higher rank only to a key of at least its rank
/// (see `Entry::rank`).
pub(crate) const GIVES_WAY_TO_ANY: u8 = 1;

/// How many entries are compared to pick the one to evict.
pub(crate) const EVICTION_SAMPLE: usize = 8;
/// A shard of at most this many entries whose sample held nothing to evict is looked at
/// whole.
pub(crate) const EVICTION_SCAN: usize = 64;
/// How many random buckets are probed at most to draw that sample from one shard.
pub(crate) const EVICTION_PROBES: usize = 64;
/// How many shards are tried for an eviction before giving up.
pub(crate) const EVICTION_SHARDS: usize = 4;
/// A shard is swept when it has doubled since its last sweep, once it holds this many.
pub(crate) const MIN_SWEEP: usize = 64;
/// A shard that has doubled since its last sweep and holds at least this many entries is swept
/// at once, however recent that sweep; a smaller one waits until its last sweep is
/// [`SWEEP_GAP`] old.
pub(crate) const GROWTH_SWEEP: usize = 4096;
/// How many survivors' idle times are kept by a sweep to choose when the next one is due.
pub(crate) const SWEEP_SAMPLE: usize = 16;
/// The least time between two sweeps of a shard that are not forced by a full table or by
/// growth (1 s): keys that go idle within moments of each request (clients slower than their
/// quota) stay tracked and take the lookup path, instead of being swept and inserted again.
pub(crate) const SWEEP_GAP: u64 = 1_000_000_000;

/// The bound on the entries of one table, or of several that share it: a rate-limit layer's
/// tiers and its penalty box count their keys against one `max_keys`.
pub(crate) struct Bound {
    /// Places taken in all the tables (reserved before an insert, given back after a removal).
    pub(crate) len: AtomicUsize,
    max_keys: usize,
    /// The owners of the tables sharing this bound, asked for room when one table has none.
    members: Mutex<Vec<Weak<dyn Room>>>,
    /// One hash of a key for every table sharing the bound (each table seeds its own): how
    /// the key asking for room is told apart in the others.
    hasher: foldhash::fast::RandomState,
}

/// The owner of a table that shares a [`Bound`], as the other tables see it: each reads its
/// own clock (the owners' clocks need not share an epoch).
pub(crate) trait Room: Send + Sync {
    /// Drops the table's idle entries; whether any was dropped.
    fn drop_idle(&self) -> bool;
    /// Evicts one entry of rank at most `rank` if the table's policy evicts, never the entry
    /// of the key whose [`Bound::spare`] hash is `spare` (the key asking for room: a strike
    /// must not free its own key's quota state); its place in the bound is then the caller's.
    fn evict(&self, rank: u8, spare: Option<u64>) -> bool;
    /// Nanoseconds until an entry of the table may go idle (`u64::MAX`: none).
    fn idle_in(&self) -> u64;
}

impl Bound {
    /// A bound of `max_keys` (at least 1) that no other table shares yet.
    pub(crate) fn new(max_keys: usize) -> Self {
        Bound {
            len: AtomicUsize::new(0),
            max_keys: max_keys.max(1),
            members: Mutex::new(Vec::new()),
            hasher: foldhash::fast::RandomState::default(),
        }
    }

    /// The hash of `key` that every table sharing this bound reads alike (see [`Room::evict`]).
    pub(crate) fn spare<K: std::hash::Hash>(&self, key: &K) -> u64 {
        use std::hash::BuildHasher;
        self.hasher.hash_one(key)
    }

    /// The number of places.
    pub(crate) fn max_keys(&self) -> usize {
        self.max_keys
    }

    /// Takes a place if there is one.
    #[inline]
    pub(crate) fn reserve(&self) -> bool {
        self.len
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max_keys).then_some(n + 1)
            })
            .is_ok()
    }

    /// Gives back `n` places.
    #[inline]
    pub(crate) fn give_back(&self, n: usize) {
        self.len.fetch_sub(n, Ordering::AcqRel);
    }

    /// Whether a place is free.
    pub(crate) fn has_room(&self) -> bool {
        self.len.load(Ordering::Acquire) < self.max_keys
    }

    /// Asks `owner`'s table for room when another table sharing this bound has none.
    pub(crate) fn join(&self, owner: Weak<dyn Room>) {
        self.lock().push(owner);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Weak<dyn Room>>> {
        // A poisoned lock only means a panic while a member was pushed; the list stays valid.
        self.members.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The members still alive, taken out of the lock before any is asked (a member asked for
    /// room takes its own table's locks).
    fn members(&self) -> Vec<std::sync::Arc<dyn Room>> {
        self.lock().iter().filter_map(Weak::upgrade).collect()
    }

    /// Drops the idle entries of the tables sharing this bound; whether any was dropped.
    pub(crate) fn drop_idle(&self) -> bool {
        self.members().iter().any(|m| m.drop_idle())
    }

    /// Evicts an entry of rank at most `rank` from a table sharing this bound whose policy
    /// evicts, the lowest rank first; its place is then the caller's.
    pub(crate) fn evict(&self, rank: u8, spare: Option<u64>) -> bool {
        let members = self.members();
        (0..=rank).any(|r| members.iter().any(|m| m.evict(r, spare)))
    }

    /// Nanoseconds until an entry of a table sharing this bound may go idle.
    pub(crate) fn idle_in(&self) -> u64 {
        self.members()
            .iter()
            .map(|m| m.idle_in())
            .min()
            .unwrap_or(u64::MAX)
    }
}
