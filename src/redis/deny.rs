//! The local deny cache: rejections that Redis already decided, answered without asking again.
//!
//! When Redis rejects a request of cost `c` for a key, the reply says when the same request
//! would pass (`retry_after`) and how far ahead each quota is (`reset_after`). While Redis keeps
//! the key, its stored times only grow (other instances can only add to them), so until then
//! every request of cost `c` or more for that key would be rejected too: the cache answers
//! those itself, with times measured from when the request was *sent* (never later than when
//! Redis decided, so the cache never rejects a request that Redis would admit).
//!
//! Redis can lose a key's state, though: a restart without persistence, `FLUSHALL`, eviction
//! under `maxmemory`, a failover to a replica that lagged. Then its times move *back*, and a
//! rejection remembered before the loss would be wrong for the rest of its retry time (an hour
//! for a quota of one per hour). So a rejection is trusted for at most `max_age` after its
//! request was sent (the store's [`deny_cache_max_age`](super::RedisStore::deny_cache_max_age),
//! one second by default): after a loss at time `L`, every entry remembered before `L` has
//! expired by `L + max_age`, and the next request asks Redis. Every instance agrees with Redis
//! again within `max_age` of a loss, whatever its cause, and a flood still costs at most one
//! round trip per key and `max_age`. An admission that shows a key further back than its entry
//! says (the loss seen directly) drops the entry at once.
//!
//! Bounded: expired entries are swept whenever a shard doubles since its last sweep (as in the
//! memory store); a full shard caches nothing more until a sweep frees room.

use std::hash::{BuildHasher, Hash};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use hashbrown::HashTable;

use crate::gcra::{self, Decision, Gcra, Outcome, MAX_QUOTAS};

const SHARDS: usize = 16;
const MIN_SWEEP: usize = 64;

#[derive(Debug, Clone, Copy)]
struct Entry {
    /// The smallest cost known to be rejected.
    cost: u32,
    /// Until when (limiter clock, ns) that cost is rejected without asking Redis: the retry
    /// time, or the trust bound (`max_age` after the request was sent) if that comes first.
    until: u64,
    /// A lower bound of each quota's stored time, on the limiter's clock.
    tats: [u64; MAX_QUOTAS],
}

struct Table<K> {
    entries: HashTable<(K, Entry)>,
    sweep_at: usize,
}

pub(crate) struct DenyCache<K> {
    shards: Box<[Mutex<Table<K>>]>,
    hasher: foldhash::fast::RandomState,
    max_per_shard: usize,
    /// How long after its request a rejection is trusted (ns).
    max_age: u64,
    saved: AtomicU64,
}

impl<K: Hash + Eq + Clone> DenyCache<K> {
    /// A cache of at most about `max_entries` keys, each rejection trusted for at most
    /// `max_age` nanoseconds after its request was sent.
    pub(crate) fn new(max_entries: usize, max_age: u64) -> Self {
        DenyCache {
            shards: (0..SHARDS)
                .map(|_| {
                    Mutex::new(Table {
                        entries: HashTable::new(),
                        sweep_at: MIN_SWEEP,
                    })
                })
                .collect(),
            hasher: foldhash::fast::RandomState::default(),
            max_per_shard: max_entries.div_ceil(SHARDS).max(1),
            max_age,
            saved: AtomicU64::new(0),
        }
    }

    fn shard(&self, hash: u64) -> &Mutex<Table<K>> {
        &self.shards[((hash >> 40) as usize) % SHARDS]
    }

    /// The rejection of a request of `cost` for `key` at `now`, if the cache knows it.
    pub(crate) fn check(&self, key: &K, gcras: &[Gcra], now: u64, cost: u32) -> Option<Decision> {
        let hash = self.hasher.hash_one(key);
        let entry = {
            let table = self.shard(hash).lock().unwrap_or_else(|e| e.into_inner());
            let (_, entry) = table.entries.find(hash, |(k, _)| k == key)?;
            *entry
        };
        if now >= entry.until || cost < entry.cost {
            return None;
        }
        let mut tats = entry.tats;
        let (d, _) = gcra::decide(gcras, &mut tats[..gcras.len()], now, cost);
        if d.outcome() == Outcome::Allowed {
            return None;
        }
        self.saved.fetch_add(1, Ordering::Relaxed);
        Some(d)
    }

    /// Remembers a rejection that Redis decided for a request of `cost` sent at `sent_at`.
    pub(crate) fn remember(&self, key: &K, sent_at: u64, cost: u32, d: &Decision) {
        let Some(wait) = d.retry_after() else { return };
        let wait = u64::try_from(wait.as_nanos()).unwrap_or(u64::MAX);
        let mut entry = Entry {
            cost,
            until: sent_at.saturating_add(wait.min(self.max_age)),
            tats: [0; MAX_QUOTAS],
        };
        for (t, s) in entry.tats.iter_mut().zip(d.states()) {
            *t = sent_at.saturating_add(s.reset_after_nanos());
        }
        let hash = self.hasher.hash_one(key);
        let mut table = self.shard(hash).lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, e)) = table.entries.find_mut(hash, |(k, _)| k == key) {
            *e = entry;
            return;
        }
        if table.entries.len() >= table.sweep_at {
            table.entries.retain(|(_, e)| e.until > sent_at);
            table.sweep_at = (table.entries.len() * 2).max(MIN_SWEEP);
        }
        if table.entries.len() >= self.max_per_shard {
            return;
        }
        let hasher = &self.hasher;
        table
            .entries
            .insert_unique(hash, (key.clone(), entry), |(k, _)| hasher.hash_one(k));
    }

    /// Brings a cached entry up to date after Redis admitted a request for `key` sent at
    /// `sent_at`, so that later local rejections report the times that follow from it; drops
    /// the entry when Redis shows the key further back than the entry knew it (its state was
    /// lost since).
    pub(crate) fn admitted(&self, key: &K, sent_at: u64, d: &Decision) {
        let hash = self.hasher.hash_one(key);
        let mut table = self.shard(hash).lock().unwrap_or_else(|e| e.into_inner());
        let Ok(found) = table.entries.find_entry(hash, |(k, _)| k == key) else {
            return;
        };
        let mut tats = [0; MAX_QUOTAS];
        for (t, s) in tats.iter_mut().zip(d.states()) {
            *t = sent_at.saturating_add(s.reset_after_nanos());
        }
        let n = d.states().len();
        if tats[..n]
            .iter()
            .zip(&found.get().1.tats[..n])
            .any(|(new, old)| new < old)
        {
            found.remove();
        } else {
            let mut found = found;
            found.get_mut().1.tats = tats;
        }
    }

    /// Requests answered from the cache.
    pub(crate) fn saved(&self) -> u64 {
        self.saved.load(Ordering::Relaxed)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).entries.len())
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn limited(gcra: &Gcra, tat: u64, now: u64, cost: u32) -> Decision {
        let mut tats = [tat];
        let (d, _) = gcra::decide(std::slice::from_ref(gcra), &mut tats, now, cost);
        assert_eq!(d.outcome(), Outcome::Limited);
        d
    }

    #[test]
    fn rejects_the_same_or_larger_cost_until_the_retry_time_only() {
        // 10/s burst 5, key spent: tat = 500 ms at t = 0.
        let g = Gcra::new(100 * MS, 500 * MS);
        let cache = DenyCache::new(100, u64::MAX);
        let d = limited(&g, 500 * MS, 0, 2);
        assert_eq!(d.retry_after(), Some(std::time::Duration::from_millis(200)));
        cache.remember(&"k", 0, 2, &d);
        let gs = [g];
        assert!(cache.check(&"k", &gs, 150 * MS, 2).is_some());
        let d3 = cache.check(&"k", &gs, 150 * MS, 3).expect("larger cost");
        assert_eq!(
            d3.retry_after(),
            Some(std::time::Duration::from_millis(150))
        );
        // A smaller cost, another key, or the retry time reached: ask Redis.
        assert!(cache.check(&"k", &gs, 150 * MS, 1).is_none());
        assert!(cache.check(&"other", &gs, 150 * MS, 2).is_none());
        assert!(cache.check(&"k", &gs, 200 * MS, 2).is_none());
        assert_eq!(cache.saved(), 2);
    }

    #[test]
    fn a_rejection_is_trusted_for_max_age_at_most() {
        // 1/h: the retry time is an hour, the trust one second.
        let g = Gcra::new(3_600_000 * MS, 3_600_000 * MS);
        let cache = DenyCache::new(100, 1_000 * MS);
        let d = limited(&g, 3_600_000 * MS, 0, 1);
        cache.remember(&"k", 0, 1, &d);
        let gs = [g];
        let local = cache.check(&"k", &gs, 999 * MS, 1).expect("still trusted");
        // The answer is still the one Redis gave, counted down.
        assert_eq!(
            local.retry_after(),
            Some(std::time::Duration::from_millis(3_599_001))
        );
        assert!(cache.check(&"k", &gs, 1_000 * MS, 1).is_none());
        // A shorter retry time than the trust ends the entry first.
        let short = Gcra::new(100 * MS, 100 * MS);
        let d = limited(&short, 50 * MS, 0, 1);
        cache.remember(&"s", 0, 1, &d);
        assert!(cache.check(&"s", &[short], 49 * MS, 1).is_some());
        assert!(cache.check(&"s", &[short], 50 * MS, 1).is_none());
    }

    #[test]
    fn an_admission_that_shows_lost_state_drops_the_entry() {
        // 10/s burst 5, cost 2 rejected at 0 with the key 400 ms ahead.
        let g = Gcra::new(100 * MS, 500 * MS);
        let gs = [g];
        let cache = DenyCache::new(100, u64::MAX);
        cache.remember(&"k", 0, 2, &limited(&g, 400 * MS, 0, 2));
        // Redis admits a cost of 1 at 10 ms, the key now at 500 ms: it moved forward, the
        // entry stays and reports the later times.
        let (moved, _) = gcra::decide(&gs, &mut [400 * MS], 10 * MS, 1);
        assert!(moved.is_allowed());
        cache.admitted(&"k", 10 * MS, &moved);
        let d = cache.check(&"k", &gs, 10 * MS, 2).expect("still rejected");
        assert_eq!(d.retry_after(), Some(std::time::Duration::from_millis(190)));
        // Then Redis admits a cost of 1 on a key it had lost: 100 ms ahead only.
        let (fresh, _) = gcra::decide(&gs, &mut [0], 20 * MS, 1);
        cache.admitted(&"k", 20 * MS, &fresh);
        assert!(cache.check(&"k", &gs, 20 * MS, 2).is_none());
        assert_eq!(cache.len(), 0);
    }

    #[test]
    fn stays_bounded_by_sweeping_expired_entries() {
        let g = Gcra::new(100 * MS, 100 * MS);
        let cache = DenyCache::new(SHARDS * 100, u64::MAX);
        for i in 0..100_000u64 {
            let now = i * 10 * MS;
            let d = limited(&g, now + 100 * MS, now, 1);
            cache.remember(&i, now, 1, &d);
        }
        assert!(cache.len() <= SHARDS * 100, "{}", cache.len());
    }
}
