//! The local deny cache: rejections that Redis already decided, answered without asking again.
//!
//! When Redis rejects a request of cost `c` for a key, the reply says when the same request
//! would pass (`retry_after`) and how far ahead each quota is (`reset_after`). A key's stored
//! times only grow (other instances can only add to them), so until then every request of cost
//! `c` or more for that key would be rejected too: the cache answers those itself, with times
//! measured from when the request was *sent* (never later than when Redis decided, so the
//! cache never rejects a request that Redis would admit).
//!
//! Bounded: the entries live in the crate's keyed table, which drops expired ones before
//! anything else; a cache full of unexpired entries caches nothing more until one expires.

use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::gcra::{self, Decision, Gcra, Outcome, MAX_QUOTAS};
use crate::keyed::{Absent, OnFull, Table};

#[derive(Debug, Clone, Copy)]
struct Entry {
    /// The smallest cost known to be rejected.
    cost: u32,
    /// Until when (limiter clock, ns) that cost is rejected.
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
    saved: AtomicU64,
}

impl<K: Hash + Eq + Clone> DenyCache<K> {
    pub(crate) fn new(max_entries: usize) -> Self {
        DenyCache {
            table: Table::new(max_entries, OnFull::RejectNewKeys),
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
        let mut entry = Entry {
            cost,
            until: sent_at.saturating_add(u64::try_from(wait.as_nanos()).unwrap_or(u64::MAX)),
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
    /// `sent_at`, so that later local rejections report the times that follow from it.
    pub(crate) fn admitted(&self, key: &K, sent_at: u64, d: &Decision) {
        let hash = self.table.hash(key);
        self.table.get_mut(hash, key, |e| {
            for (t, s) in e.tats.iter_mut().zip(d.states()) {
                *t = sent_at.saturating_add(s.reset_after_nanos());
            }
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
        let cache = DenyCache::new(100);
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
    fn stays_bounded_by_sweeping_expired_entries() {
        let g = Gcra::new(100 * MS, 100 * MS);
        let cache = DenyCache::new(1_600);
        for i in 0..100_000u64 {
            let now = i * 10 * MS;
            let d = limited(&g, now + 100 * MS, now, 1);
            cache.remember(&i, now, 1, &d);
        }
        assert!(cache.len() <= 1_600, "{}", cache.len());
    }
}
