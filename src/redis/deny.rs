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
//! Bounded: the entries live in the crate's keyed table, which drops expired ones before
//! anything else; a cache full of unexpired entries caches nothing more until one expires.

use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::algo::gcra::{self, Gcra};
use crate::decision::{Decision, Outcome, MAX_QUOTAS};
use crate::keyed::{Absent, OnFull, Table};

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

impl crate::keyed::Entry for Entry {
    /// Expired entries answer nothing: dropping them changes nothing.
    fn idle_at(&self) -> u64 {
        self.until
    }
}

pub(crate) struct DenyCache<K> {
    table: Table<K, Entry>,
    /// How long after its request a rejection is trusted (ns).
    max_age: u64,
    saved: AtomicU64,
}

impl<K: Hash + Eq + Clone> DenyCache<K> {
    /// A cache of at most about `max_entries` keys, each rejection trusted for at most
    /// `max_age` nanoseconds after its request was sent.
    pub(crate) fn new(max_entries: usize, max_age: u64) -> Self {
        DenyCache {
            table: Table::new(max_entries, OnFull::RejectNewKeys),
            max_age,
            saved: AtomicU64::new(0),
        }
    }

    /// The rejection of a request of `cost` for `key` at `now`, if the cache knows it.
    pub(crate) fn check(&self, key: &K, gcras: &[Gcra], now: u64, cost: u32) -> Option<Decision> {
        let hash = self.table.hash(key);
        let entry = self.table.get(hash, key, now, |entry| *entry)?;
        if now >= entry.until || cost < entry.cost {
            return None;
        }
        // Remembered under other quotas than those in force now (a change while serving),
        // the times are judged by the quotas in force, as Redis judges them.
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
        let hash = self.table.hash(key);
        // A cache full of unexpired entries caches nothing more.
        let _ = self.table.upsert(
            hash,
            key,
            false,
            || sent_at,
            |e, _| *e = entry,
            |_| Absent::Insert((), entry),
        );
    }

    /// Brings a cached entry up to date after Redis admitted a request for `key` sent at
    /// `sent_at`, so that later local rejections report the times that follow from it; drops
    /// the entry when Redis shows the key further back than the entry knew it (its state was
    /// lost since).
    pub(crate) fn admitted(&self, key: &K, sent_at: u64, d: &Decision) {
        let mut tats = [0; MAX_QUOTAS];
        for (t, s) in tats.iter_mut().zip(d.states()) {
            *t = sent_at.saturating_add(s.reset_after_nanos());
        }
        let n = d.states().len();
        let hash = self.table.hash(key);
        self.table.update_or_remove(hash, key, |e| {
            let n = n.min(MAX_QUOTAS);
            if tats[..n]
                .iter()
                .zip(&e.tats[..n])
                .any(|(new, old)| new < old)
            {
                return false;
            }
            e.tats = tats;
            true
        });
    }

    /// Requests answered from the cache.
    pub(crate) fn saved(&self) -> u64 {
        self.saved.load(Ordering::Relaxed)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.table.len()
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
        let cache = DenyCache::new(1_600, u64::MAX);
        for i in 0..100_000u64 {
            let now = i * 10 * MS;
            let d = limited(&g, now + 100 * MS, now, 1);
            cache.remember(&i, now, 1, &d);
        }
        assert!(cache.len() <= 1_600, "{}", cache.len());
    }
}
