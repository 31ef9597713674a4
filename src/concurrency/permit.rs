//! Where permits come from: one semaphore for a global limit, one per active key for a keyed
//! limit, each with a bounded count of waiters.
//!
//! * **Permits** are `tokio::sync::Semaphore` permits taken out of the semaphore (`forget`) and
//!   given back by [`Permit`]'s `Drop`, so one permit type serves both kinds of limit and the
//!   response body does not depend on the key type.
//! * **Waiting** is the semaphore's own queue: fair (first in, first out) and cancellation
//!   safe. A place in it is reserved first by a compare-and-swap on the waiter count, which
//!   never goes above its bound, however many requests race for the last place.
//! * **Keys.** A key's semaphore lives in a sharded table while anyone holds, waits for or is
//!   about to ask for one of its permits (its `users`). The last one to leave removes it, under
//!   the shard's lock, so the table holds no more keys than there are requests in flight or
//!   waiting.

use std::hash::{BuildHasher, Hash};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use hashbrown::hash_table::Entry;
use hashbrown::HashTable;
use tokio::sync::Semaphore;

/// A place among the requests in flight, given back when dropped.
pub(crate) struct Permit(Arc<dyn Limited>);

impl Drop for Permit {
    #[inline]
    fn drop(&mut self) {
        let limit = &self.0;
        limit.gate().sem.add_permits(1);
        limit.leave();
    }
}

/// Something with a [`Gate`]: the global limit, or one key's slot.
pub(crate) trait Limited: Send + Sync + 'static {
    fn gate(&self) -> &Gate;
    /// Called when a request that held or waited for a permit is done with this limit.
    fn leave(&self) {}
}

/// A semaphore and its bounded count of waiters.
pub(crate) struct Gate {
    sem: Semaphore,
    max: usize,
    waiting: AtomicUsize,
}

impl Gate {
    fn new(max: usize) -> Self {
        Gate {
            sem: Semaphore::new(max),
            max,
            waiting: AtomicUsize::new(0),
        }
    }

    /// Takes a free permit out of the semaphore, without waiting.
    #[inline]
    fn try_take(&self) -> bool {
        match self.sem.try_acquire() {
            Ok(p) => {
                p.forget();
                true
            }
            Err(_) => false,
        }
    }

    /// Reserves a place among at most `max_waiting` waiters.
    fn try_enter_queue(&self, max_waiting: usize) -> bool {
        self.waiting
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                (w < max_waiting).then_some(w + 1)
            })
            .is_ok()
    }

    fn in_flight(&self) -> usize {
        self.max.saturating_sub(self.sem.available_permits())
    }

    fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Acquire)
    }

    /// Tries to take a permit for a request that is already counted as a user of `limit`;
    /// `queue` is the most requests that may wait, if any may.
    #[inline]
    fn attempt<L: Limited>(limit: Arc<L>, queue: Option<usize>) -> Attempt<L> {
        let gate = limit.gate();
        if gate.try_take() {
            return Attempt::Acquired(Permit(limit));
        }
        let Some(max_waiting) = queue else {
            limit.leave();
            return Attempt::Busy;
        };
        if gate.try_enter_queue(max_waiting) {
            Attempt::Wait(Waiter(Some(limit)))
        } else {
            limit.leave();
            Attempt::QueueFull
        }
    }
}

/// What trying to take a permit without waiting gives.
pub(crate) enum Attempt<L: Limited> {
    /// A permit was free.
    Acquired(Permit),
    /// None was free and a place in the queue was reserved: wait with this.
    Wait(Waiter<L>),
    /// None was free and there is no queue.
    Busy,
    /// None was free and the queue is full.
    QueueFull,
}

/// A request with a reserved place in a queue. Dropping it (the request was cancelled, or it
/// gave up) gives the place back at once.
pub(crate) struct Waiter<L: Limited>(Option<Arc<L>>);

impl<L: Limited> Drop for Waiter<L> {
    fn drop(&mut self) {
        if let Some(limit) = self.0.take() {
            limit.gate().waiting.fetch_sub(1, Ordering::AcqRel);
            limit.leave();
        }
    }
}

impl<L: Limited> Waiter<L> {
    /// Waits in the semaphore's first-in-first-out queue for at most `max_wait`; `None` on
    /// timeout.
    ///
    /// Cancellation safe: dropping the future leaves the queue and, should a permit have been
    /// assigned to it meanwhile, hands that permit on.
    pub(crate) async fn acquire(mut self, max_wait: Duration) -> Option<Permit> {
        let gate = self.0.as_ref()?.gate();
        match tokio::time::timeout(max_wait, gate.sem.acquire()).await {
            Ok(Ok(p)) => p.forget(),
            // The semaphore is never closed: this is the timeout. Dropping `self` leaves.
            _ => return None,
        }
        let limit = self.0.take()?;
        limit.gate().waiting.fetch_sub(1, Ordering::AcqRel);
        Some(Permit(limit))
    }
}

/// The one limit of a layer without a key.
pub(crate) struct GlobalLimit(Gate);

impl Limited for GlobalLimit {
    #[inline]
    fn gate(&self) -> &Gate {
        &self.0
    }
}

impl GlobalLimit {
    pub(crate) fn new(max: usize) -> Arc<Self> {
        Arc::new(GlobalLimit(Gate::new(max)))
    }

    #[inline]
    pub(crate) fn try_acquire(self: &Arc<Self>, queue: Option<usize>) -> Attempt<Self> {
        Gate::attempt(self.clone(), queue)
    }

    pub(crate) fn in_flight(&self) -> usize {
        self.0.in_flight()
    }

    pub(crate) fn waiting(&self) -> usize {
        self.0.waiting()
    }
}

#[repr(align(128))]
struct Shard<K>(Mutex<HashTable<Arc<Slot<K>>>>);

/// Per-key limits: a semaphore for each key that has requests in flight or waiting.
pub(crate) struct KeyedLimit<K> {
    shards: Box<[Shard<K>]>,
    hasher: foldhash::fast::RandomState,
    shard_mask: u64,
    max: usize,
}

/// A key's semaphore, in its shard's table while `users > 0`.
pub(crate) struct Slot<K> {
    key: K,
    hash: u64,
    gate: Gate,
    /// Requests that hold, wait for or are about to ask for a permit of this key. Only ever
    /// incremented under the shard's lock, so the one that brings it to zero can remove the
    /// slot exactly.
    users: AtomicUsize,
    limit: Arc<KeyedLimit<K>>,
}

impl<K: Hash + Eq + Send + Sync + 'static> Limited for Slot<K> {
    #[inline]
    fn gate(&self) -> &Gate {
        &self.gate
    }

    fn leave(&self) {
        if self.users.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.limit.remove_if_unused(self);
        }
    }
}

impl<K: Hash + Eq + Send + Sync + 'static> KeyedLimit<K> {
    pub(crate) fn new(max: usize) -> Arc<Self> {
        let cpus = std::thread::available_parallelism().map_or(4, |n| n.get());
        // Enough shards that two threads rarely meet on a lock, as in the rate-limit store.
        let n = (cpus * 8).clamp(16, 256).next_power_of_two();
        Arc::new(KeyedLimit {
            shards: (0..n)
                .map(|_| Shard(Mutex::new(HashTable::new())))
                .collect(),
            hasher: foldhash::fast::RandomState::default(),
            shard_mask: (n - 1) as u64,
            max,
        })
    }

    #[inline]
    fn shard(&self, hash: u64) -> MutexGuard<'_, HashTable<Arc<Slot<K>>>> {
        // hashbrown uses the low and the top bits of the hash; the shard takes bits in between.
        let shard = &self.shards[((hash >> 40) & self.shard_mask) as usize];
        shard.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Tries to take a permit of `key`'s semaphore, creating it if the key is new.
    #[inline]
    pub(crate) fn try_acquire(self: &Arc<Self>, key: K, queue: Option<usize>) -> Attempt<Slot<K>> {
        Gate::attempt(self.visit(key), queue)
    }

    /// Finds or creates the slot of `key` and counts this request among its users.
    fn visit(self: &Arc<Self>, key: K) -> Arc<Slot<K>> {
        let hash = self.hasher.hash_one(&key);
        let mut table = self.shard(hash);
        let slot = match table.entry(hash, |s| s.key == key, |s| s.hash) {
            Entry::Occupied(e) => e.get().clone(),
            Entry::Vacant(e) => {
                let slot = Arc::new(Slot {
                    key,
                    hash,
                    gate: Gate::new(self.max),
                    users: AtomicUsize::new(0),
                    limit: self.clone(),
                });
                e.insert(slot.clone());
                slot
            }
        };
        slot.users.fetch_add(1, Ordering::AcqRel);
        slot
    }

    fn remove_if_unused(&self, slot: &Slot<K>) {
        let mut table = self.shard(slot.hash);
        // Someone may have found the slot and joined it since its count reached zero.
        if slot.users.load(Ordering::Acquire) != 0 {
            return;
        }
        if let Ok(e) = table.find_entry(slot.hash, |s| std::ptr::eq(&**s, slot)) {
            e.remove();
            // A flood of keys has gone: give the memory back too.
            if table.capacity() > 64 && table.len() < table.capacity() / 4 {
                let len = table.len();
                table.shrink_to(len * 2, |s| s.hash);
            }
        }
    }

    /// Keys with requests in flight or waiting.
    pub(crate) fn len(&self) -> usize {
        self.sum(|t| t.len())
    }

    pub(crate) fn in_flight(&self) -> usize {
        self.sum(|t| t.iter().map(|s| s.gate.in_flight()).sum())
    }

    pub(crate) fn waiting(&self) -> usize {
        self.sum(|t| t.iter().map(|s| s.gate.waiting()).sum())
    }

    fn sum(&self, f: impl Fn(&HashTable<Arc<Slot<K>>>) -> usize) -> usize {
        self.shards
            .iter()
            .map(|s| f(&s.0.lock().unwrap_or_else(|e| e.into_inner())))
            .sum()
    }
}
