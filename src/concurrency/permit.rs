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
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use hashbrown::hash_table::Entry;
use hashbrown::HashTable;
use tokio::sync::Semaphore;

use super::control::{Control, GateCtl, Priority};

/// A place among the requests in flight, given back when dropped.
pub(crate) struct Permit {
    gate: Arc<Gate>,
    /// For an adaptive limit: when it was taken, and what the sample will say.
    measure: Option<Measure>,
}

/// What an adaptive limit learns from a permit when its request completes.
struct Measure {
    start: Duration,
    in_flight: usize,
    dropped: bool,
    /// Taken into account already (a body that was at its end before being read).
    recorded: AtomicBool,
}

impl Permit {
    #[inline]
    fn new(gate: Arc<Gate>) -> Self {
        let measure = gate.ctl.as_ref().and_then(|ctl| {
            ctl.control.measuring().then(|| Measure {
                start: ctl.control.now(),
                in_flight: ctl.in_flight(),
                dropped: false,
                recorded: AtomicBool::new(false),
            })
        });
        Permit { gate, measure }
    }

    /// The response says the service is overloaded (`503`, `504`).
    pub(crate) fn mark_dropped(&mut self) {
        if let Some(m) = &mut self.measure {
            m.dropped = true;
        }
    }

    /// The request completed (its body ended, or failed if `failed`): an adaptive limit takes
    /// its latency into account, then the place is given back. A permit dropped without this
    /// (the client went away) teaches the limit nothing.
    pub(crate) fn finish(self, failed: bool) {
        self.record(failed);
    }

    /// The request completed, but the place is kept until the permit is dropped (a body
    /// already at its end, which the server may drop without reading). Only the first call
    /// counts.
    pub(crate) fn record(&self, failed: bool) {
        if let (Some(m), Some(ctl)) = (&self.measure, &self.gate.ctl) {
            if !m.recorded.swap(true, Ordering::AcqRel) {
                ctl.control
                    .record(m.start, m.in_flight, m.dropped || failed);
            }
        }
    }
}

impl Drop for Permit {
    #[inline]
    fn drop(&mut self) {
        match &self.gate.ctl {
            Some(ctl) => ctl.release(&self.gate.sem),
            None => self.gate.sem.add_permits(1),
        }
        self.gate.leave();
    }
}

/// A semaphore, its bounded count of waiters, and for a key the way out of the table.
pub(crate) struct Gate {
    sem: Semaphore,
    max: usize,
    waiting: AtomicUsize,
    key: Option<KeyState>,
    /// An adaptive limit or priorities: the limit moves, in-flight requests are counted.
    ctl: Option<GateCtl>,
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
    /// The request's priority class has used up its share of the limit.
    Shed,
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
    Shed,
}

impl Gate {
    fn new(max: usize, key: Option<KeyState>, control: Option<&Arc<Control>>) -> Self {
        let (ctl, permits) = match control {
            Some(c) => {
                let (ctl, permits) = GateCtl::new(c.clone());
                (Some(ctl), permits)
            }
            None => (None, max),
        };
        Gate {
            sem: Semaphore::new(permits),
            max,
            waiting: AtomicUsize::new(0),
            key,
            ctl,
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
    fn try_take(&self, queue: Option<usize>, priority: Priority) -> Outcome {
        if let Some(ctl) = &self.ctl {
            match self.try_take_controlled(ctl, priority) {
                Some(outcome) => return outcome,
                None => return self.enqueue(queue),
            }
        }
        if let Ok(p) = self.sem.try_acquire() {
            p.forget();
            return Outcome::Acquired;
        }
        self.enqueue(queue)
    }

    /// `try_take` for a moving limit or priorities; `None` when the request may queue.
    #[inline]
    fn try_take_controlled(&self, ctl: &GateCtl, priority: Priority) -> Option<Outcome> {
        ctl.sync(&self.sem);
        if priority == Priority::Critical {
            let p = self.sem.try_acquire().ok()?;
            p.forget();
            ctl.taken();
            return Some(Outcome::Acquired);
        }
        if !ctl.reserve(priority) {
            return Some(Outcome::Shed);
        }
        match self.sem.try_acquire() {
            Ok(p) => {
                p.forget();
                Some(Outcome::Acquired)
            }
            Err(_) => {
                ctl.unreserve();
                None
            }
        }
    }

    /// Reserves a place in the queue, if there is one.
    #[inline]
    fn enqueue(&self, queue: Option<usize>) -> Outcome {
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
        match &self.ctl {
            Some(ctl) => ctl.in_flight(),
            None => self.max.saturating_sub(self.sem.available_permits()),
        }
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
        if let Some(ctl) = &gate.ctl {
            ctl.taken();
        }
        Some(Permit::new(gate))
    }
}

/// The one limit of a layer without a key.
pub(crate) struct GlobalLimit(Arc<Gate>);

impl GlobalLimit {
    pub(crate) fn new(max: usize, control: Option<&Arc<Control>>) -> Self {
        GlobalLimit(Arc::new(Gate::new(max, None, control)))
    }

    #[inline]
    pub(crate) fn try_acquire(&self, queue: Option<usize>, priority: Priority) -> Attempt {
        // The `Arc` is cloned only when the request keeps it: a rejection under a flood
        // writes no shared memory.
        match self.0.try_take(queue, priority) {
            Outcome::Acquired => Attempt::Acquired(Permit::new(self.0.clone())),
            Outcome::Queued => Attempt::Wait(Waiter(Some(self.0.clone()))),
            Outcome::Busy => Attempt::Busy,
            Outcome::QueueFull => Attempt::QueueFull,
            Outcome::Shed => Attempt::Shed,
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
    /// One adaptive limit (or priorities) shared by every key's gate.
    control: Option<Arc<Control>>,
}

impl<K: Hash + Eq + Send + Sync + 'static> KeyedLimit<K> {
    pub(crate) fn new(max: usize, control: Option<Arc<Control>>) -> Arc<Self> {
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
            control,
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
    pub(crate) fn try_acquire(
        self: &Arc<Self>,
        key: K,
        queue: Option<usize>,
        priority: Priority,
    ) -> Attempt {
        let gate = self.visit(key);
        match gate.try_take(queue, priority) {
            Outcome::Acquired => Attempt::Acquired(Permit::new(gate)),
            Outcome::Queued => Attempt::Wait(Waiter(Some(gate))),
            Outcome::Busy => {
                gate.leave();
                Attempt::Busy
            }
            Outcome::QueueFull => {
                gate.leave();
                Attempt::QueueFull
            }
            Outcome::Shed => {
                gate.leave();
                Attempt::Shed
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
                let gate = Arc::new(Gate::new(self.max, Some(key_state), self.control.as_ref()));
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
