//! The penalty box on Redis: the scripts that check a ban, decide the quotas and count the
//! strike in one call, and the local cache of bans Redis has announced.
//!
//! * **One round trip.** With a penalty box, a decision is one `EVALSHA` of a script made of
//!   `ban.lua` around the quota script: the ban is checked first (a banned key's request
//!   consumes nothing), then the quotas decide, then a rejection counts as a strike and may
//!   ban. The penalty state is a second Redis key, `<prefix>ban:<name length>:<name>:<key>`,
//!   which never has the name of a quota key (those start with a digit after the prefix).
//! * **Bans are cached, rejections are not.** A ban Redis announced is answered locally until
//!   it ends, for at most the store's `deny_cache_max_age` (so that a ban lost with Redis's
//!   state is not enforced longer than that). Quota rejections are *not* answered from the
//!   deny cache when a penalty box is on: each must reach Redis to count as a strike, so a
//!   key costs one round trip per rejected request until it is banned, and about one per
//!   `deny_cache_max_age` and instance while banned.
//! * **State loss.** A ban lives in Redis only: after a restart without persistence or a
//!   `FLUSHALL`, bans, strikes and offences are gone, and every instance serves the key again
//!   within `deny_cache_max_age`.

use std::hash::Hash;

use crate::keyed::{Absent, OnFull, Table};

/// A ban Redis announced, as this instance remembers it (limiter clock, ns).
#[derive(Debug, Clone, Copy)]
struct Cached {
    /// When the ban ends: from then on the quotas decide.
    ends: u64,
    /// When a retry is admitted, as Redis said (the ban's end, or later when the quotas
    /// that refused the request that brought the ban admit it later).
    retry_at: u64,
    /// Until when the ban is answered without asking Redis.
    trusted_until: u64,
}

impl crate::keyed::Entry for Cached {
    fn idle_at(&self) -> u64 {
        self.trusted_until
    }
}

/// The bans this instance has seen Redis announce.
pub(crate) struct BanCache<K> {
    table: Table<K, Cached>,
    max_age: u64,
}

impl<K: Hash + Eq + Clone> BanCache<K> {
    pub(crate) fn new(max_entries: usize, max_age: u64) -> Self {
        BanCache {
            table: Table::new(max_entries, OnFull::RejectNewKeys),
            max_age,
        }
    }

    /// Nanoseconds until a retry of `key` is admitted at `now`, if a ban is known, still
    /// trusted and not over.
    pub(crate) fn left(&self, key: &K, now: u64) -> Option<u64> {
        let hash = self.table.hash(key);
        let c = self.table.get(hash, key, now, |c| *c)?;
        (now < c.trusted_until && now < c.ends).then(|| c.retry_at.max(c.ends) - now)
    }

    /// Remembers that Redis said `key` is banned for `ban` ns and a retry is admitted in
    /// `wait` ns, for a request sent at `sent_at` (never later than when Redis answered, so
    /// the ban is never thought to end later).
    pub(crate) fn remember(&self, key: &K, sent_at: u64, wait: u64, ban: u64) {
        let left = ban.min(wait);
        let entry = Cached {
            ends: sent_at.saturating_add(left),
            retry_at: sent_at.saturating_add(wait),
            trusted_until: sent_at.saturating_add(left.min(self.max_age)),
        };
        let hash = self.table.hash(key);
        let _ = self.table.upsert(
            hash,
            key,
            false,
            || sent_at,
            |e, _| *e = entry,
            |_| Absent::Insert((), entry),
        );
    }

    /// Forgets what is known of `key`'s ban.
    pub(crate) fn forget(&self, key: &K) {
        let hash = self.table.hash(key);
        self.table.remove_if(hash, |k, _| k == key);
    }
}
