//! The in-memory store: sharded hash tables, one word per key for single-quota policies.
//!
//! * **Hot path.** A decision on a tracked key takes its shard's lock for reading and updates the
//!   key's time with one compare-and-swap (single quota) or under the key's own small lock
//!   (several quotas, so that they change together). Rejections write nothing.
//! * **Hashing.** Keys come from clients: they are hashed with foldhash seeded at random for each
//!   process, once per decision (the hash picks the shard and the bucket).
//! * **Exact eviction.** A key whose every time is in the past decides exactly like an absent
//!   key, so such entries are dropped whenever a shard would otherwise grow: each sweep runs when
//!   a shard has doubled since the last one, which keeps the cost per insert constant, and needs
//!   no background task. [`crate::RateLimiter::evict_idle`] sweeps every shard on demand.
//! * **Bound.** At most `max_keys` keys are tracked; see [`OnFull`].

use std::hash::{BuildHasher, Hash};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};

use hashbrown::HashTable;

use crate::gcra::{self, Decision, Gcra, MAX_QUOTAS};

/// What the memory store does with a new key when it already tracks `max_keys` keys that are
/// all still active (idle keys are always evicted first, which changes no decision).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OnFull {
    /// Forget the tracked key nearest to idle, among a small sample of its shard, and track the
    /// new one. The forgotten key's next request starts from a full burst, so a flood of
    /// distinct keys can loosen the limit of the least active keys by at most their burst, and
    /// never denies service to a new client. The default.
    #[default]
    EvictNearestIdle,
    /// Reject requests from new keys (as rate limited, retry after one emission interval) until
    /// a tracked key goes idle. Tracked keys keep their exact state; new clients are turned away
    /// while the store is full.
    RejectNewKeys,
}

/// Per-key state: the theoretical arrival time of each quota.
pub(crate) trait Slot: Send + Sync + Sized {
    fn new(tats: &[u64]) -> Self;
    /// Decides for a key that has no entry; returns the entry to insert when admitted.
    fn decide_absent(gcras: &[Gcra], now: u64, cost: u32) -> (Decision, Option<Self>);
    /// Decides under shared access; must be atomic for the key.
    fn decide(&self, gcras: &[Gcra], now: u64, cost: u32) -> Decision;
    /// The latest time of any quota: the key is idle once `now` reaches it.
    fn horizon(&self) -> u64;
    /// Gives back `cost` admitted earlier; see [`refunded`]. Atomic for the key.
    fn refund(&self, gcras: &[Gcra], now: u64, cost: u32);
}

/// A quota's time once a request of `cost` admitted earlier is given back at `now`: `cost`
/// emission intervals earlier, but never before `now` (a time in the past already means a full
/// burst, so a refund never grants more than the burst). A time already past is left as it is:
/// everything the request took has come back on its own.
#[inline]
pub(crate) fn refunded(g: &Gcra, tat: u64, now: u64, cost: u32) -> u64 {
    if tat <= now {
        return tat;
    }
    tat.saturating_sub(g.interval.saturating_mul(u64::from(cost)))
        .max(now)
}

/// One quota: the whole state is one word, updated by compare-and-swap.
pub(crate) struct One(AtomicU64);

impl One {
    pub(crate) fn idle() -> Self {
        One(AtomicU64::new(0))
    }
}

impl Slot for One {
    fn new(tats: &[u64]) -> Self {
        One(AtomicU64::new(tats[0]))
    }

    #[inline]
    fn decide_absent(gcras: &[Gcra], now: u64, cost: u32) -> (Decision, Option<Self>) {
        let (d, store) = gcra::decide_one(&gcras[0], 0, now, cost);
        (d, store.map(|t| One(AtomicU64::new(t))))
    }

    #[inline]
    fn decide(&self, gcras: &[Gcra], now: u64, cost: u32) -> Decision {
        let g = &gcras[0];
        let mut tat = self.0.load(Ordering::Acquire);
        loop {
            let (decision, store) = gcra::decide_one(g, tat, now, cost);
            let Some(new_tat) = store else {
                return decision;
            };
            match self
                .0
                .compare_exchange_weak(tat, new_tat, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return decision,
                Err(actual) => tat = actual,
            }
        }
    }

    fn horizon(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }

    fn refund(&self, gcras: &[Gcra], now: u64, cost: u32) {
        let g = &gcras[0];
        let mut tat = self.0.load(Ordering::Acquire);
        loop {
            let new_tat = refunded(g, tat, now, cost);
            if new_tat == tat {
                return;
            }
            match self
                .0
                .compare_exchange_weak(tat, new_tat, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return,
                Err(actual) => tat = actual,
            }
        }
    }
}

/// Several quotas: the times change together under the key's own lock.
pub(crate) struct Many(Mutex<[u64; MAX_QUOTAS]>);

impl Many {
    pub(crate) fn idle() -> Self {
        Many(Mutex::new([0; MAX_QUOTAS]))
    }
}

impl Slot for Many {
    fn new(tats: &[u64]) -> Self {
        let mut all = [0; MAX_QUOTAS];
        all[..tats.len()].copy_from_slice(tats);
        Many(Mutex::new(all))
    }

    fn decide_absent(gcras: &[Gcra], now: u64, cost: u32) -> (Decision, Option<Self>) {
        let mut tats = [0u64; MAX_QUOTAS];
        let (d, changed) = gcra::decide(gcras, &mut tats[..gcras.len()], now, cost);
        (d, changed.then(|| Many::new(&tats[..gcras.len()])))
    }

    fn decide(&self, gcras: &[Gcra], now: u64, cost: u32) -> Decision {
        // A poisoned lock only means another thread panicked between two plain stores of
        // `u64`s; the values are still valid times.
        let mut tats = self.0.lock().unwrap_or_else(|e| e.into_inner());
        gcra::decide(gcras, &mut tats[..gcras.len()], now, cost).0
    }

    fn horizon(&self) -> u64 {
        let tats = self.0.lock().unwrap_or_else(|e| e.into_inner());
        tats.iter().copied().max().unwrap_or(0)
    }

    fn refund(&self, gcras: &[Gcra], now: u64, cost: u32) {
        let mut tats = self.0.lock().unwrap_or_else(|e| e.into_inner());
        for (tat, g) in tats.iter_mut().zip(gcras) {
            *tat = refunded(g, *tat, now, cost);
        }
    }
}

/// Sweeps start once a shard holds this many keys.
const MIN_SWEEP: usize = 64;
/// How many entries are looked at to pick a victim when the store is full.
const EVICTION_SAMPLE: usize = 8;

#[repr(align(128))]
struct Shard<K, V> {
    lock: RwLock<Table<K, V>>,
}

struct Table<K, V> {
    entries: HashTable<(K, V)>,
    /// Sweep idle entries when `len` reaches this.
    sweep_at: usize,
}

pub(crate) struct MemoryStore<K, V> {
    shards: Box<[Shard<K, V>]>,
    hasher: foldhash::fast::RandomState,
    shard_mask: u64,
    max_per_shard: usize,
    on_full: OnFull,
}

impl<K, V> MemoryStore<K, V>
where
    K: Hash + Eq + Clone,
    V: Slot,
{
    pub(crate) fn new(max_keys: usize, on_full: OnFull) -> Self {
        let cpus = std::thread::available_parallelism().map_or(4, |n| n.get());
        // Enough shards that two threads rarely meet, few enough that tiny limiters stay small.
        let n = (cpus * 8).clamp(16, 256).next_power_of_two();
        let shards = (0..n)
            .map(|_| Shard {
                lock: RwLock::new(Table {
                    entries: HashTable::new(),
                    sweep_at: MIN_SWEEP,
                }),
            })
            .collect();
        MemoryStore {
            shards,
            hasher: foldhash::fast::RandomState::default(),
            shard_mask: (n - 1) as u64,
            max_per_shard: max_keys.div_ceil(n).max(1),
            on_full,
        }
    }

    #[inline]
    fn shard(&self, hash: u64) -> &Shard<K, V> {
        // hashbrown indexes buckets with the low bits and tags them with the top 7; take the
        // shard from bits in between so the three stay independent.
        &self.shards[((hash >> 40) & self.shard_mask) as usize]
    }

    /// Decides a request of `cost` for `key` at `now`.
    #[inline]
    pub(crate) fn decide(&self, key: &K, gcras: &[Gcra], now: u64, cost: u32) -> Decision {
        let hash = self.hasher.hash_one(key);
        let shard = self.shard(hash);
        {
            let table = shard.lock.read().unwrap_or_else(|e| e.into_inner());
            if let Some((_, slot)) = table.entries.find(hash, |(k, _)| k == key) {
                return slot.decide(gcras, now, cost);
            }
        }
        self.decide_absent(shard, hash, key, gcras, now, cost)
    }

    /// Gives back `cost` taken earlier from `key` (see [`refunded`]); a key without an entry
    /// is idle and has nothing to give back.
    pub(crate) fn refund(&self, key: &K, gcras: &[Gcra], now: u64, cost: u32) {
        let hash = self.hasher.hash_one(key);
        let table = self
            .shard(hash)
            .lock
            .read()
            .unwrap_or_else(|e| e.into_inner());
        if let Some((_, slot)) = table.entries.find(hash, |(k, _)| k == key) {
            slot.refund(gcras, now, cost);
        }
    }

    /// The path of a key without an entry: decided as an idle key; only an admitted request
    /// needs an entry. Kept out of line so the lookup above stays small.
    #[cold]
    #[inline(never)]
    fn decide_absent(
        &self,
        shard: &Shard<K, V>,
        hash: u64,
        key: &K,
        gcras: &[Gcra],
        now: u64,
        cost: u32,
    ) -> Decision {
        let (decision, slot) = V::decide_absent(gcras, now, cost);
        let Some(slot) = slot else {
            return decision;
        };
        let mut table = shard.lock.write().unwrap_or_else(|e| e.into_inner());
        // Another thread may have inserted it meanwhile.
        if let Some((_, slot)) = table.entries.find(hash, |(k, _)| k == key) {
            return slot.decide(gcras, now, cost);
        }
        if table.entries.len() >= table.sweep_at {
            self.sweep(&mut table, now);
        }
        if table.entries.len() >= self.max_per_shard {
            match self.on_full {
                OnFull::EvictNearestIdle => self.evict_one(&mut table),
                OnFull::RejectNewKeys => return full_rejection(gcras, now),
            }
        }
        let hasher = &self.hasher;
        table
            .entries
            .insert_unique(hash, (key.clone(), slot), |(k, _)| hasher.hash_one(k));
        decision
    }

    /// Drops every idle entry of `table` and returns memory when it is mostly empty.
    fn sweep(&self, table: &mut Table<K, V>, now: u64) {
        table.entries.retain(|(_, slot)| slot.horizon() > now);
        let len = table.entries.len();
        table.sweep_at = (len * 2).max(MIN_SWEEP);
        if table.entries.capacity() > 4 * len.max(MIN_SWEEP) {
            let hasher = &self.hasher;
            table
                .entries
                .shrink_to(len * 2, |(k, _)| hasher.hash_one(k));
        }
    }

    fn evict_one(&self, table: &mut Table<K, V>) {
        let victim = table
            .entries
            .iter()
            .take(EVICTION_SAMPLE)
            .min_by_key(|(_, slot)| slot.horizon())
            .map(|(k, _)| k.clone());
        if let Some(victim) = victim {
            let hash = self.hasher.hash_one(&victim);
            if let Ok(entry) = table.entries.find_entry(hash, |(k, _)| *k == victim) {
                entry.remove();
            }
        }
    }

    /// Drops every idle entry now; returns how many keys are still tracked.
    pub(crate) fn evict_idle(&self, now: u64) -> usize {
        self.shards
            .iter()
            .map(|shard| {
                let mut table = shard.lock.write().unwrap_or_else(|e| e.into_inner());
                self.sweep(&mut table, now);
                table.entries.len()
            })
            .sum()
    }

    /// The number of tracked keys (idle ones included until they are swept).
    pub(crate) fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| {
                s.lock
                    .read()
                    .unwrap_or_else(|e| e.into_inner())
                    .entries
                    .len()
            })
            .sum()
    }
}

/// The decision for a new key turned away because the store is full.
fn full_rejection(gcras: &[Gcra], _now: u64) -> Decision {
    Decision::store_full(gcras)
}
