//! Where permits come from: one semaphore for a global limit, one per active key for a keyed
//! limit, each with a bounded count of waiters.
//!
//! * **Permits** are `tokio::sync::Semaphore` permits taken out of the semaphore (`forget`) and
//!   given back by [`Permit`]'s `Drop`. A permit is one pointer to its [`Gate`], whatever the
//!   key type, so the response body does not depend on it.
//! * **Waiting** is the semaphore's own queue: fair (first in, first out) and cancellation
//!   safe. A place in it is reserved first by a compare-and-swap on the waiter count, which
//!   never goes above its bound, however many requests race for the last place.
//! * **Keys.** A key's gate lives in a sharded table while anyone holds, waits for or is about
//!   to ask for one of its permits (its `users`). The last one to leave removes it, under the
//!   shard's lock, so the table holds no more keys than there are requests in flight or
//!   waiting.

use std::hash::{BuildHasher, Hash};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use hashbrown::hash_table::Entry;
use hashbrown::HashTable;
use tokio::sync::Semaphore;

/// A place among the requests in flight, given back when dropped.
pub(crate) struct Permit(Arc<Gate>);

impl Drop for Permit {
    #[inline]
    fn drop(&mut self) {
        self.0.sem.add_permits(1);
        self.0.leave();
    }
}

/// A semaphore, its bounded count of waiters, and for a key the way out of the table.
pub(crate) struct Gate {
    sem: Semaphore,
    max: usize,
    waiting: AtomicUsize,
    key: Option<KeyState>,
}

/// What a key's gate needs to remove itself from its table.
struct KeyState {
    hash: u64,
    /// Requests that hold, wait for or are about to ask for a permit of this key. Only ever
    /// incremented under the shard's lock, so the one that brings it to zero can remove the
    /// gate exactly.
    users: AtomicUsize,
    table: Arc<dyn Forget>,
}

/// The table of a keyed limit, seen without its key type.
trait Forget: Send + Sync {
    fn remove_if_unused(&self, gate: &Gate);
}

/// What trying to take a permit without waiting gives.
pub(crate) enum Attempt {
    /// A permit was free.
    Acquired(Permit),
    /// None was free and a place in the queue was reserved: wait with this.
    Wait(Waiter),
    /// None was free and there is no queue.
    Busy,
    /// None was free and the queue is full.
    QueueFull,
    /// The request has no key and goes through unlimited (set by the service).
    Unlimited,
    /// The request has no key and is rejected (set by the service).
    MissingKey,
}

enum Outcome {
    Acquired,
    Queued,
    Busy,
    QueueFull,
}

impl Gate {
    fn new(max: usize, key: Option<KeyState>) -> Self {
        Gate {
            sem: Semaphore::new(max),
            max,
            waiting: AtomicUsize::new(0),
            key,
        }
    }

    /// Called when a request that held or waited for a permit is done with this gate.
    #[inline]
    fn leave(&self) {
        if let Some(key) = &self.key {
            if key.users.fetch_sub(1, Ordering::AcqRel) == 1 {
                key.table.remove_if_unused(self);
            }
        }
    }

    /// Takes a free permit, or reserves a place among at most `queue` waiters (if any may
    /// wait). Writes no shared memory when there is neither: a semaphore without permits is
    /// only read.
    #[inline]
    fn try_take(&self, queue: Option<usize>) -> Outcome {
        if let Ok(p) = self.sem.try_acquire() {
            p.forget();
            return Outcome::Acquired;
        }
        let Some(max_waiting) = queue else {
            return Outcome::Busy;
        };
        let entered = self
            .waiting
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                (w < max_waiting).then_some(w + 1)
            });
        match entered {
            Ok(_) => Outcome::Queued,
            Err(_) => Outcome::QueueFull,
        }
    }

    fn in_flight(&self) -> usize {
        self.max.saturating_sub(self.sem.available_permits())
    }

    fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Acquire)
    }
}

/// A request with a reserved place in a queue. Dropping it (the request was cancelled, or it
/// gave up) gives the place back at once.
pub(crate) struct Waiter(Option<Arc<Gate>>);

impl Drop for Waiter {
    fn drop(&mut self) {
        if let Some(gate) = self.0.take() {
            gate.waiting.fetch_sub(1, Ordering::AcqRel);
            gate.leave();
        }
    }
}

impl Waiter {
    /// Waits in the semaphore's first-in-first-out queue for at most `max_wait`; `None` on
    /// timeout.
    ///
    /// Cancellation safe: dropping the future leaves the queue and, should a permit have been
    /// assigned to it meanwhile, hands that permit on.
    pub(crate) async fn acquire(mut self, max_wait: Duration) -> Option<Permit> {
        let gate = self.0.as_ref()?;
        match tokio::time::timeout(max_wait, gate.sem.acquire()).await {
            Ok(Ok(p)) => p.forget(),
            // The semaphore is never closed: this is the timeout. Dropping `self` leaves.
            _ => return None,
        }
        let gate = self.0.take()?;
        gate.waiting.fetch_sub(1, Ordering::AcqRel);
        Some(Permit(gate))
    }
}

/// The one limit of a layer without a key.
pub(crate) struct GlobalLimit(Arc<Gate>);

impl GlobalLimit {
    pub(crate) fn new(max: usize) -> Self {
        GlobalLimit(Arc::new(Gate::new(max, None)))
    }

    #[inline]
    pub(crate) fn try_acquire(&self, queue: Option<usize>) -> Attempt {
        // The `Arc` is cloned only when the request keeps it: a rejection under a flood
        // writes no shared memory.
        match self.0.try_take(queue) {
            Outcome::Acquired => Attempt::Acquired(Permit(self.0.clone())),
            Outcome::Queued => Attempt::Wait(Waiter(Some(self.0.clone()))),
            Outcome::Busy => Attempt::Busy,
            Outcome::QueueFull => Attempt::QueueFull,
        }
    }

    pub(crate) fn in_flight(&self) -> usize {
        self.0.in_flight()
    }

    pub(crate) fn waiting(&self) -> usize {
        self.0.waiting()
    }
}

#[repr(align(128))]
struct Shard<K>(Mutex<HashTable<(K, Arc<Gate>)>>);

/// Per-key limits: a gate for each key that has requests in flight or waiting.
pub(crate) struct KeyedLimit<K> {
    shards: Box<[Shard<K>]>,
    hasher: foldhash::fast::RandomState,
    shard_mask: u64,
    max: usize,
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
    fn shard(&self, hash: u64) -> MutexGuard<'_, HashTable<(K, Arc<Gate>)>> {
        // hashbrown uses the low and the top bits of the hash; the shard takes bits in between.
        let shard = &self.shards[((hash >> 40) & self.shard_mask) as usize];
        shard.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Tries to take a permit of `key`'s gate, creating it if the key is new.
    #[inline]
    pub(crate) fn try_acquire(self: &Arc<Self>, key: K, queue: Option<usize>) -> Attempt {
        let gate = self.visit(key);
        match gate.try_take(queue) {
            Outcome::Acquired => Attempt::Acquired(Permit(gate)),
            Outcome::Queued => Attempt::Wait(Waiter(Some(gate))),
            Outcome::Busy => {
                gate.leave();
                Attempt::Busy
            }
            Outcome::QueueFull => {
                gate.leave();
                Attempt::QueueFull
            }
        }
    }

    /// Finds or creates the gate of `key` and counts this request among its users.
    fn visit(self: &Arc<Self>, key: K) -> Arc<Gate> {
        let hash = self.hasher.hash_one(&key);
        let mut table = self.shard(hash);
        let gate = match table.entry(hash, |(k, _)| *k == key, |(_, g)| gate_hash(g)) {
            Entry::Occupied(e) => e.get().1.clone(),
            Entry::Vacant(e) => {
                let key_state = KeyState {
                    hash,
                    users: AtomicUsize::new(0),
                    table: self.clone(),
                };
                let gate = Arc::new(Gate::new(self.max, Some(key_state)));
                e.insert((key, gate.clone()));
                gate
            }
        };
        if let Some(k) = &gate.key {
            k.users.fetch_add(1, Ordering::AcqRel);
        }
        gate
    }

    /// Keys with requests in flight or waiting.
    pub(crate) fn len(&self) -> usize {
        self.sum(|t| t.len())
    }

    pub(crate) fn in_flight(&self) -> usize {
        self.sum(|t| t.iter().map(|(_, g)| g.in_flight()).sum())
    }

    pub(crate) fn waiting(&self) -> usize {
        self.sum(|t| t.iter().map(|(_, g)| g.waiting()).sum())
    }

    fn sum(&self, f: impl Fn(&HashTable<(K, Arc<Gate>)>) -> usize) -> usize {
        self.shards
            .iter()
            .map(|s| f(&s.0.lock().unwrap_or_else(|e| e.into_inner())))
            .sum()
    }
}

fn gate_hash(gate: &Gate) -> u64 {
    gate.key.as_ref().map_or(0, |k| k.hash)
}

impl<K: Hash + Eq + Send + Sync + 'static> Forget for KeyedLimit<K> {
    fn remove_if_unused(&self, gate: &Gate) {
        let hash = gate_hash(gate);
        let mut table = self.shard(hash);
        // Someone may have found the gate and joined it since its count reached zero.
        if gate
            .key
            .as_ref()
            .is_some_and(|k| k.users.load(Ordering::Acquire) != 0)
        {
            return;
        }
        if let Ok(e) = table.find_entry(hash, |(_, g)| std::ptr::eq(&**g, gate)) {
            e.remove();
            // A flood of keys has gone: give the memory back too.
            if table.capacity() > 64 && table.len() < table.capacity() / 4 {
                let len = table.len();
                table.shrink_to(len * 2, |(_, g)| gate_hash(g));
            }
        }
    }
}
