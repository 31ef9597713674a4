//! The keyed-state table every keyed limiter keeps its per-key state in: the rate limiter's
//! memory store, the shaper's queues, the per-key concurrency gates and the Redis deny cache.
//!
//! * **Hashing.** Keys come from clients: they are hashed once per operation with foldhash,
//!   seeded at random for each process. The hash picks the shard (bits 40 and up) and the bucket
//!   (hashbrown takes the low bits and the top 7).
//! * **Sharding.** Each shard is a `RwLock` around a `hashbrown::HashTable`: lookups of tracked
//!   keys share the lock; inserts, removals and sweeps take it alone.
//! * **Bound.** `len() <= max_keys` over the whole table, exactly: an insert first reserves its
//!   place in one shared counter (only new keys touch it, never lookups). Several tables may
//!   share one bound (a [`Bound`]: a rate-limit layer's tiers and its penalty box), so that
//!   `max_keys` counts the entries of all of them; a table that finds no room then drops the
//!   idle entries of the others too, and evicts from them as their own policies allow.
//! * **Idle entries** (see [`Entry`]) decide exactly like absent ones, so dropping them changes
//!   nothing. A full table drops them, from any shard, before it applies [`OnFull`]; each shard
//!   keeps a lower bound of its entries' idle times, so a shard without idle entries is skipped
//!   without being looked at, and the search costs one atomic load per shard.
//! * **Shrinking without a background task.** A shard is also swept when it has doubled since
//!   its last sweep (so inserts stay amortized O(1)) and that sweep is a second old, or it is
//!   large, and when any operation on it finds that its next sweep is due: a sweep remembers
//!   when about half of the entries it kept will be idle. Keys that go idle between requests
//!   therefore stay tracked for a second and are looked up, not inserted again each time. After a flood ends, ordinary traffic therefore sweeps every shard it touches, and a
//!   shard that is mostly empty gives its memory back to the allocator.

mod bound;
mod entry;

use std::hash::{BuildHasher, Hash};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard};

use hashbrown::HashTable;

pub use bound::OnFull;
pub(crate) use bound::{Bound, Full, Room};
use bound::{
    EVICTION_PROBES, EVICTION_SAMPLE, EVICTION_SCAN, EVICTION_SHARDS, GROWTH_SWEEP, MIN_SWEEP,
    SWEEP_GAP, SWEEP_SAMPLE,
};
pub(crate) use entry::Entry;

/// A bounded, sharded map from client keys to per-key state.
pub(crate) struct Table<K, V> {
    shards: Box<[Shard<K, V>]>,
    hasher: foldhash::fast::RandomState,
    shard_mask: u64,
    /// The places of this table's entries (reserved before an insert, released after a
    /// removal) while it shares no bound.
    own: Bound,
    /// The bound this table counts its entries in with other tables, once it shares one (set
    /// once, when the owner is built: reading it costs one load on every insert and removal,
    /// where an `ArcSwap` claims and releases a slot).
    shared: OnceLock<Arc<Bound>>,
    /// Entries in all shards of this table.
    len: AtomicUsize,
    /// The most entries this table takes of a bound it shares (its `max_keys`; reserves taken
    /// at once may pass it by a few, the bound itself never).
    cap: usize,
    on_full: OnFull,
    /// The state of the random numbers drawn for eviction samples (see `draw`).
    draws: AtomicU64,
}

#[repr(align(128))]
struct Shard<K, V> {
    map: RwLock<Map<K, V>>,
    /// No entry of this shard is idle before this time. Lowered by inserts and set by sweeps,
    /// both under the write lock.
    min_idle: AtomicU64,
    /// When a sweep of this shard is next worth its cost.
    next_sweep: AtomicU64,
}

struct Map<K, V> {
    entries: HashTable<(K, V)>,
    /// Sweep when `len` reaches this.
    sweep_at: usize,
    /// The time of the last sweep (0: none yet).
    swept_at: u64,
}

/// The result of [`Table::upsert`] for a key that had no entry.
pub(crate) enum Absent<R, V> {
    /// Nothing to insert; return this.
    Done(R),
    /// Insert this value and return `R`.
    Insert(R, V),
}

impl<K: Hash + Eq + Clone, V: Entry> Table<K, V> {
    /// A table of at most `max_keys` keys (at least 1).
    pub(crate) fn new(max_keys: usize, on_full: OnFull) -> Self {
        let max_keys = max_keys.max(1);
        let cpus = std::thread::available_parallelism().map_or(4, |n| n.get());
        // Enough shards that two threads rarely meet on a lock; no more than keys, so that a
        // tiny table stays tiny and an eviction sample finds entries.
        let most = 1usize << max_keys.ilog2();
        let n = (cpus * 8).clamp(16, 256).next_power_of_two().min(most);
        let shards = (0..n)
            .map(|_| Shard {
                map: RwLock::new(Map {
                    entries: HashTable::new(),
                    sweep_at: MIN_SWEEP,
                    swept_at: 0,
                }),
                min_idle: AtomicU64::new(u64::MAX),
                next_sweep: AtomicU64::new(u64::MAX),
            })
            .collect();
        let hasher = foldhash::fast::RandomState::default();
        // The eviction draws start at a point of the sequence nobody outside can know.
        let seed = hasher.hash_one(u64::MAX);
        Table {
            shards,
            hasher,
            shard_mask: (n - 1) as u64,
            own: Bound::new(max_keys),
            shared: OnceLock::new(),
            len: AtomicUsize::new(0),
            cap: max_keys,
            on_full,
            draws: AtomicU64::new(seed),
        }
    }

    /// The hash of `key`, to pass to the other methods.
    #[inline]
    pub(crate) fn hash(&self, key: &K) -> u64 {
        self.hasher.hash_one(key)
    }

    #[inline]
    fn shard_index(&self, hash: u64) -> usize {
        // foldhash's own bits are made for hashbrown's use (the low bits pick a bucket, the
        // top seven are a tag), not for picking a shard: with some process seeds, bits 40-43
        // of the hashes of 256 consecutive integers put 80 or more in one of 16 shards. A
        // multiplication by the golden ratio carries every bit of the hash into the top ones.
        ((hash.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) & self.shard_mask) as usize
    }

    /// Calls `f` with the entry of `key`, if tracked, under the shard's shared lock. `now` only
    /// tells whether the shard's next sweep is due.
    #[inline]
    pub(crate) fn get<R>(
        &self,
        hash: u64,
        key: &K,
        now: u64,
        f: impl FnOnce(&V) -> R,
    ) -> Option<R> {
        let shard = &self.shards[self.shard_index(hash)];
        // The sweep comes first, so that what `f` returns is made where it is returned (a
        // decision is many words): a key the sweep drops was idle, and an idle key decides as
        // an absent one.
        if now >= shard.next_sweep.load(Ordering::Relaxed) {
            self.maintain(shard, now);
        }
        let map = read(&shard.map);
        map.entries.find(hash, |(k, _)| k == key).map(|(_, v)| f(v))
    }

    /// As [`get`](Self::get), for a change that may bring the entry's idle time earlier (a
    /// refund): the shard's lower bound of idle times follows it, so that a sweep or a full
    /// table finds the entry idle as soon as it is, before any live key is evicted.
    pub(crate) fn get_lowering<R>(
        &self,
        hash: u64,
        key: &K,
        now: u64,
        f: impl FnOnce(&V) -> R,
    ) -> Option<R> {
        let shard = &self.shards[self.shard_index(hash)];
        // Under the shard's lock, as sweeps set the bound under it.
        self.get(hash, key, now, |v| {
            let r = f(v);
            // Read first: a refund that leaves the bound where it was writes no shared line.
            let idle_at = v.idle_at();
            if idle_at < shard.min_idle.load(Ordering::Relaxed) {
                shard.min_idle.fetch_min(idle_at, Ordering::Relaxed);
            }
            r
        })
    }

    /// Finds or inserts the entry of `key`, under the shard's exclusive lock.
    ///
    /// `clock` is read once the lock is held, so that no sweep with a later time can remove
    /// the key between the reading and the decision. `present` is called with the entry (to read or change) when
    /// the key is tracked; otherwise `absent` says what to insert (it may be called more than
    /// once if the table is full and room is made, each time with a fresh reading). Returns
    /// [`Full`] when the key would need an entry and the table has no room for it.
    ///
    /// With `over_bound`, a key that finds no room is inserted all the same (the caller has
    /// promised never to refuse it); `len` then exceeds `max_keys` until entries go.
    pub(crate) fn upsert<R>(
        &self,
        hash: u64,
        key: &K,
        over_bound: bool,
        clock: impl Fn() -> u64,
        present: impl FnOnce(&mut V, u64) -> R,
        mut absent: impl FnMut(u64) -> Absent<R, V>,
    ) -> Result<R, Full> {
        let index = self.shard_index(hash);
        let shard = &self.shards[index];
        // Holding a place in `len` for this key (taken from the counter or from an eviction).
        let mut reserved = false;
        // Whether this table's own count already holds it (taken with the place, so that
        // inserts racing on other shards never take this table past its cap).
        let mut counted = false;
        let mut searched = false;
        let mut evictions = 0;
        loop {
            let now;
            // The highest rank the value to insert may evict: its own, and at least the ranks
            // that give way to any new key.
            let rank;
            {
                let mut map = write(&shard.map);
                now = clock();
                if now >= shard.next_sweep.load(Ordering::Relaxed) {
                    self.sweep(shard, &mut map, now);
                }
                if let Some((_, v)) = map.entries.find_mut(hash, |(k, _)| k == key) {
                    self.unreserve(reserved, counted);
                    return Ok(present(v, now));
                }
                let (result, value) = match absent(now) {
                    Absent::Done(r) => {
                        self.unreserve(reserved, counted);
                        return Ok(r);
                    }
                    Absent::Insert(r, v) => (r, v),
                };
                if map.entries.len() >= map.sweep_at
                    && shard.min_idle.load(Ordering::Relaxed) <= now
                    && growth_sweep_due(&map, now)
                {
                    self.sweep(shard, &mut map, now);
                }
                if !reserved {
                    reserved = self.reserve();
                    counted = reserved;
                }
                if !reserved && over_bound && searched {
                    self.bound().len.fetch_add(1, Ordering::AcqRel);
                    reserved = true;
                }
                if !reserved && shard.min_idle.load(Ordering::Relaxed) <= now {
                    self.sweep(shard, &mut map, now);
                    reserved = self.reserve();
                    counted = reserved;
                }
                rank = value.rank(now).max(bound::GIVES_WAY_TO_ANY);
                if reserved {
                    let idle_at = value.idle_at();
                    let hasher = &self.hasher;
                    map.entries
                        .insert_unique(hash, (key.clone(), value), |(k, _)| hasher.hash_one(k));
                    if !counted {
                        self.len.fetch_add(1, Ordering::AcqRel);
                    }
                    // Read first: the write lock keeps every other writer of the hint out, and
                    // an insert that leaves it where it was writes no shared line.
                    if idle_at < shard.min_idle.load(Ordering::Relaxed) {
                        shard.min_idle.store(idle_at, Ordering::Relaxed);
                    }
                    return Ok(result);
                }
            }
            // Full, and this shard holds no idle entry: look in the others, and in the tables
            // this one shares its bound with (once).
            if !searched {
                searched = true;
                if self.sweep_idle_shards(index, now) || self.bound().drop_idle() {
                    continue;
                }
            }
            if over_bound {
                continue;
            }
            match self.on_full {
                OnFull::RejectNewKeys => {}
                OnFull::EvictNearestIdle => {
                    // A table at its own cap makes room among its own entries only; below it,
                    // it takes its place in its own count first, so that tables sharing the
                    // bound never take it past its cap.
                    let capped = !self.count_one();
                    let bound = self.bound();
                    let spare = Some(bound.spare(key));
                    if evictions < EVICTION_SHARDS {
                        // An entry of this table evicted keeps its place in the count for
                        // this key (no racing insert takes it).
                        let own = self.evict_one(now, rank, spare, true);
                        if own || (!capped && bound.evict(rank, spare)) {
                            if own && !capped {
                                self.len.fetch_sub(1, Ordering::AcqRel);
                            }
                            // The evicted entry's place in the bound is now this key's.
                            reserved = true;
                            counted = true;
                            evictions += 1;
                            continue;
                        }
                    }
                    if !capped {
                        self.len.fetch_sub(1, Ordering::AcqRel);
                    }
                }
            }
            return Err(Full {
                retry_at: self.retry_at(now),
                elsewhere: self.bound().idle_in(),
            });
        }
    }

    /// Whether a new key would find a place now: fewer than `max_keys` entries, an idle entry
    /// (dropped here), or under [`OnFull::EvictNearestIdle`] an entry to evict. For a key that
    /// takes nothing now but may need its entry later; nothing is inserted or evicted.
    pub(crate) fn room(&self, now: u64) -> Result<(), Full> {
        if self.bound().has_room() {
            return Ok(());
        }
        let first = &self.shards[0];
        if first.min_idle.load(Ordering::Relaxed) <= now {
            let mut map = write(&first.map);
            if self.sweep(first, &mut map, now) > 0 {
                return Ok(());
            }
        }
        if self.sweep_idle_shards(0, now) || self.bound().drop_idle() {
            return Ok(());
        }
        match self.on_full {
            OnFull::EvictNearestIdle => Ok(()),
            OnFull::RejectNewKeys => Err(Full {
                retry_at: self.retry_at(now),
                elsewhere: self.bound().idle_in(),
            }),
        }
    }

    /// Tells the table that the entry of `hash` may now be idle as early as `at`: for values
    /// whose idle time moves earlier outside the table's lock (a shaping queue whose waiter
    /// gives up). Without it the shard's hint could stay above the truth, and a full table
    /// would pass over an idle entry there while it refuses or evicts a live one elsewhere.
    pub(crate) fn lower_idle_hint(&self, hash: u64, at: u64) {
        let shard = &self.shards[self.shard_index(hash)];
        // Under the shared lock, so that no sweep is between reading the old idle time and
        // storing its hint: a sweep either ends before this (and its hint is lowered here) or
        // starts after (and reads the new idle time itself).
        let _map = read(&shard.map);
        shard.min_idle.fetch_min(at, Ordering::Relaxed);
    }

    /// Whether every shard's hint is at or below the idle time of each of its entries: the
    /// invariant that lets a full table skip shards whose hint lies in the future.
    #[cfg(test)]
    pub(crate) fn hints_hold(&self) -> bool {
        self.shards.iter().all(|shard| {
            let map = read(&shard.map);
            let hint = shard.min_idle.load(Ordering::Relaxed);
            map.entries.iter().all(|(_, v)| hint <= v.idle_at())
        })
    }

    /// Takes a place in this table's count (below its cap) and in the bound, if there is one.
    #[inline]
    fn reserve(&self) -> bool {
        if !self.count_one() {
            return false;
        }
        if self.bound().reserve() {
            return true;
        }
        self.len.fetch_sub(1, Ordering::AcqRel);
        false
    }

    /// Counts one more entry of this table if it is below its cap.
    #[inline]
    fn count_one(&self) -> bool {
        self.len
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.cap).then_some(n + 1)
            })
            .is_ok()
    }

    /// Gives back a place taken for a key that needs none after all.
    #[inline]
    fn unreserve(&self, reserved: bool, counted: bool) {
        if reserved {
            self.bound().give_back(1);
        }
        if counted {
            self.len.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Counts this table's entries in `bound` from now on, with those of the other tables that
    /// share it (see [`Bound::join`]).
    ///
    /// A table shares one bound at most: a later call changes nothing.
    pub(crate) fn share(&self, bound: Arc<Bound>) {
        let len = self.len.load(Ordering::Acquire);
        if self.shared.set(bound.clone()).is_ok() {
            bound.len.fetch_add(len, Ordering::AcqRel);
        }
    }

    /// The bound this table counts its entries in.
    #[inline]
    fn bound(&self) -> &Bound {
        match self.shared.get() {
            Some(shared) => shared,
            None => &self.own,
        }
    }

    /// Drops the idle entries of the shards that may hold one; whether any was dropped.
    pub(crate) fn drop_idle(&self, now: u64) -> bool {
        let first = &self.shards[0];
        if first.min_idle.load(Ordering::Relaxed) <= now {
            let mut map = write(&first.map);
            if self.sweep(first, &mut map, now) > 0 {
                return true;
            }
        }
        self.sweep_idle_shards(0, now)
    }

    /// Evicts an entry of rank at most `rank` for a key of another table sharing the bound,
    /// if this table's policy evicts; its place in the bound is the caller's.
    pub(crate) fn evict_for_other(&self, now: u64, rank: u8, spare: Option<u64>) -> bool {
        self.on_full == OnFull::EvictNearestIdle && self.evict_one(now, rank, spare, false)
    }

    /// Nanoseconds from `now` until an entry of this table may go idle (`u64::MAX`: none).
    pub(crate) fn idle_in(&self, now: u64) -> u64 {
        if self.len() == 0 {
            return u64::MAX;
        }
        self.retry_at(now).saturating_sub(now)
    }

    /// Removes the entry of `key` if `pred` says so, under the shard's exclusive lock.
    pub(crate) fn remove_if(&self, hash: u64, mut pred: impl FnMut(&K, &V) -> bool) -> bool {
        let shard = &self.shards[self.shard_index(hash)];
        let mut map = write(&shard.map);
        let Ok(entry) = map.entries.find_entry(hash, |(k, v)| pred(k, v)) else {
            return false;
        };
        entry.remove();
        self.release(1);
        self.shrink(&mut map);
        true
    }

    /// Calls `f` with the entry of `key`, if tracked, under the shard's exclusive lock, and
    /// removes the entry when `f` returns `false`.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn update_or_remove(&self, hash: u64, key: &K, f: impl FnOnce(&mut V) -> bool) {
        let shard = &self.shards[self.shard_index(hash)];
        let mut map = write(&shard.map);
        let Ok(mut entry) = map.entries.find_entry(hash, |(k, _)| k == key) else {
            return;
        };
        if f(&mut entry.get_mut().1) {
            return;
        }
        entry.remove();
        self.release(1);
        self.shrink(&mut map);
    }

    /// `n` entries of this table are gone, and their places in the bound are free.
    fn release(&self, n: usize) {
        self.len.fetch_sub(n, Ordering::AcqRel);
        self.bound().give_back(n);
    }

    /// Sweeps one shard if its next sweep is due and nobody else holds it.
    #[cold]
    #[inline(never)]
    fn maintain(&self, shard: &Shard<K, V>, now: u64) {
        let Ok(mut map) = shard.map.try_write() else {
            return;
        };
        if now >= shard.next_sweep.load(Ordering::Relaxed) {
            self.sweep(shard, &mut map, now);
        }
    }

    /// Drops every idle entry of a shard, sets its hints, and gives memory back when the shard
    /// is mostly empty. Returns how many entries were dropped.
    fn sweep(&self, shard: &Shard<K, V>, map: &mut Map<K, V>, now: u64) -> usize {
        let before = map.entries.len();
        let mut min_idle = u64::MAX;
        let mut sample = [0u64; SWEEP_SAMPLE];
        let mut sampled = 0;
        map.entries.retain(|(_, v)| {
            if v.is_idle(now) {
                return false;
            }
            // Not idle yet although its time has come (a queue whose last waiters have not
            // left yet): look again at the next sweep.
            let at = v.idle_at().max(now.saturating_add(1));
            min_idle = min_idle.min(at);
            if sampled < SWEEP_SAMPLE {
                sample[sampled] = at;
                sampled += 1;
            }
            true
        });
        let len = map.entries.len();
        let dropped = before - len;
        if dropped > 0 {
            self.release(dropped);
        }
        map.sweep_at = (len * 2).max(MIN_SWEEP);
        map.swept_at = now;
        shard.min_idle.store(min_idle, Ordering::Relaxed);
        // Due again when about half of what was kept will be idle (entries are in hash order,
        // so the first ones are a fair sample), and never before the first one is.
        let sample = &mut sample[..sampled];
        sample.sort_unstable();
        let next = sample.get(sampled / 2).copied().unwrap_or(u64::MAX);
        shard.next_sweep.store(
            next.max(min_idle).max(now.saturating_add(SWEEP_GAP)),
            Ordering::Relaxed,
        );
        self.shrink(map);
        dropped
    }

    /// Gives memory back when a shard is mostly empty.
    fn shrink(&self, map: &mut Map<K, V>) {
        let len = map.entries.len();
        if map.entries.capacity() > 4 * len.max(MIN_SWEEP / 4) {
            let hasher = &self.hasher;
            map.entries.shrink_to(len * 2, |(k, _)| hasher.hash_one(k));
        }
    }

    /// Sweeps the shards (other than `skip`) that may hold an idle entry, stopping at the first
    /// that frees room. Never holds two shard locks at once.
    fn sweep_idle_shards(&self, skip: usize, now: u64) -> bool {
        let n = self.shards.len();
        for step in 1..n {
            let shard = &self.shards[(skip + step) % n];
            if shard.min_idle.load(Ordering::Relaxed) > now {
                continue;
            }
            let mut map = write(&shard.map);
            if self.sweep(shard, &mut map, now) > 0 {
                return true;
            }
        }
        false
    }

    /// Forgets an evictable entry of the lowest rank there is (at most `rank`), the nearest to
    /// idle among a random sample of that rank, keeping its place in the bound for the caller,
    /// and with `keep` its place in this table's count too.
    ///
    /// Shards are looked at from a random one on; the first entry of the lowest rank a value
    /// can have ([`Entry::MIN_RANK`]) is taken at once, so a table whose values all share one
    /// rank looks at one shard as before. Otherwise every shard is looked at once and the
    /// shard that held the lowest rank is looked at again.
    fn evict_one(&self, now: u64, rank: u8, spare: Option<u64>, keep: bool) -> bool {
        let n = self.shards.len();
        let start = self.shard_index(self.draw());
        let mut lowest: Option<(u8, usize)> = None;
        for step in 0..n {
            let i = (start + step) % n;
            let mut map = write(&self.shards[i].map);
            let Some((r, index)) = self.pick(&map, now, rank, spare) else {
                continue;
            };
            if r <= V::MIN_RANK {
                if let Ok(entry) = map.entries.get_bucket_entry(index) {
                    entry.remove();
                    if !keep {
                        self.len.fetch_sub(1, Ordering::AcqRel);
                    }
                    return true;
                }
            }
            if lowest.map_or(true, |(l, _)| r < l) {
                lowest = Some((r, i));
            }
        }
        let Some((r, i)) = lowest else {
            return false;
        };
        let mut map = write(&self.shards[i].map);
        match self.pick(&map, now, r, spare) {
            Some((_, index)) => match map.entries.get_bucket_entry(index) {
                Ok(entry) => {
                    entry.remove();
                    if !keep {
                        self.len.fetch_sub(1, Ordering::AcqRel);
                    }
                    true
                }
                Err(_) => false,
            },
            None => false,
        }
    }

    /// The bucket of the evictable entry of one shard to forget first: the lowest rank (at
    /// most `rank`), then the nearest to idle, among a random sample (every entry of a sparse
    /// shard). With it, its rank.
    fn pick(&self, map: &Map<K, V>, now: u64, rank: u8, spare: Option<u64>) -> Option<(u8, usize)> {
        let buckets = map.entries.num_buckets();
        if map.entries.is_empty() || buckets == 0 {
            return None;
        }
        let bound = spare.map(|_| self.bound());
        let spared = |k: &K| match (&bound, spare) {
            (Some(b), Some(h)) => b.spare(k) == h,
            _ => false,
        };
        let eligible = |k: &K, v: &V| {
            let r = v.rank(now);
            (r <= rank && v.evictable(now) && !spared(k)).then(|| (r, v.idle_at()))
        };
        let mut best: Option<((u8, u64), usize)> = None;
        let mut seen = 0;
        for _ in 0..EVICTION_PROBES {
            // Each draw gives two bucket indices.
            let draw = self.draw();
            for index in [draw as u32 as usize, (draw >> 32) as usize] {
                let index = index % buckets;
                let Some((k, v)) = map.entries.get_bucket(index) else {
                    continue;
                };
                seen += 1;
                if let Some(at) = eligible(k, v) {
                    if best.map_or(true, |(b, _)| at < b) {
                        best = Some((at, index));
                    }
                }
            }
            if seen >= EVICTION_SAMPLE {
                break;
            }
        }
        if best.is_none() && (seen < EVICTION_SAMPLE || map.entries.len() <= EVICTION_SCAN) {
            // A sparse or small shard: look at every entry, so that an entry the probes missed
            // is found (the only one of a rank that may go, say).
            best = map
                .entries
                .iter()
                .filter_map(|(k, v)| Some((eligible(k, v)?, k)))
                .min_by_key(|(at, _)| *at)
                .and_then(|(at, k)| {
                    let h = self.hasher.hash_one(k);
                    map.entries
                        .find_bucket_index(h, |(x, _)| x == k)
                        .map(|index| (at, index))
                });
        }
        best.map(|((r, _), index)| (r, index))
    }

    /// A random number nobody outside the process can predict.
    ///
    /// SplitMix64 over a counter that starts at a seed drawn from the table's random hasher
    /// state. The hasher itself is not used on the counter: its outputs for consecutive
    /// integers share high bits often enough that the shards picked for eviction clustered.
    fn draw(&self) -> u64 {
        let n = self
            .draws
            .fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed);
        let mut z = n.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// The earliest time at which a tracked entry goes idle, for a key refused at `now`. The
    /// shards' hints are lower bounds that go stale when a tracked entry's idle time moves
    /// later (a key that spends again), and a retry time taken from a stale hint would send
    /// the client back before there is room. So the shard with the lowest hint is swept (which
    /// makes its hint exact) until the lowest hint is one made exact here.
    #[cold]
    fn retry_at(&self, now: u64) -> u64 {
        let mut exact = [0u64; 4];
        loop {
            let Some((i, shard)) = self
                .shards
                .iter()
                .enumerate()
                .min_by_key(|(_, s)| s.min_idle.load(Ordering::Relaxed))
            else {
                return u64::MAX;
            };
            if exact[i / 64] & (1 << (i % 64)) != 0 {
                return shard.min_idle.load(Ordering::Relaxed);
            }
            exact[i / 64] |= 1 << (i % 64);
            let mut map = write(&shard.map);
            if self.sweep(shard, &mut map, now) > 0 {
                // Room was made since the table was found full: retry at once.
                return now;
            }
        }
    }

    /// Drops every idle entry now; returns how many entries are left.
    pub(crate) fn evict_idle(&self, now: u64) -> usize {
        for shard in self.shards.iter() {
            let mut map = write(&shard.map);
            self.sweep(shard, &mut map, now);
        }
        self.len()
    }

    /// Drops every entry that `gone` says to drop, each shard under its exclusive lock in
    /// turn; returns how many were dropped. `gone` may also change the idle times of the
    /// entries it keeps, either way (a change of what they are judged by, which may bring
    /// them earlier than the shard's hint): each shard's hint is then the earliest idle time
    /// of the entries it keeps, so that a full table passes over no shard holding an idle
    /// entry, and it costs nothing on the paths that read or write an entry.
    pub(crate) fn drop_where(&self, mut gone: impl FnMut(&V) -> bool) -> usize {
        let mut dropped = 0;
        for shard in self.shards.iter() {
            let mut map = write(&shard.map);
            let before = map.entries.len();
            let mut min_idle = u64::MAX;
            map.entries.retain(|(_, v)| {
                if gone(v) {
                    return false;
                }
                min_idle = min_idle.min(v.idle_at());
                true
            });
            // Under the exclusive lock, as sweeps set it: no write in place is between.
            shard.min_idle.store(min_idle, Ordering::Relaxed);
            let n = before - map.entries.len();
            if n > 0 {
                self.release(n);
                self.shrink(&mut map);
                dropped += n;
            }
        }
        dropped
    }

    /// The number of entries of this table, idle ones included until they are swept (the
    /// bound may count others' too).
    pub(crate) fn len(&self) -> usize {
        self.len.load(Ordering::Acquire)
    }

    /// Calls `f` for every entry (one shard locked at a time).
    pub(crate) fn for_each(&self, mut f: impl FnMut(&K, &V)) {
        for shard in self.shards.iter() {
            let map = read(&shard.map);
            for (k, v) in map.entries.iter() {
                f(k, v);
            }
        }
    }
}

/// Whether a shard that has doubled since its last sweep is swept now: once its last sweep is
/// [`SWEEP_GAP`] old, or at once when it holds [`GROWTH_SWEEP`] entries or more. Keys that go
/// idle within moments of each request (clients slower than their quota) then stay tracked and
/// take the lookup path for a second, instead of being swept and inserted again every few
/// dozen inserts; the idle entries a flood leaves are dropped at the next due sweep, or as soon
/// as they are many.
#[inline]
fn growth_sweep_due<K, V>(map: &Map<K, V>, now: u64) -> bool {
    map.entries.len() >= GROWTH_SWEEP || now >= map.swept_at.saturating_add(SWEEP_GAP)
}

// A poisoned lock means a panic elsewhere while the lock was held; the tables' values are plain
// numbers and handles that stay valid, and a table that refuses every request would be worse.
fn read<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|e| e.into_inner())
}

fn write<T>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests;
