//! Where permits come from: one semaphore for a global limit, one per active key for a keyed
//! limit, each with a bounded count of waiters.
//!
//! * **Permits** are `tokio::sync::Semaphore` permits taken out of the semaphore (`forget`) and
//!   given back by [`Permit`]'s `Drop`. A permit is one pointer to its [`Gate`], whatever the
//!   key type, so the response body does not depend on it.
//! * **Waiting** is the semaphore's own queue: fair (first in, first out) and cancellation
//!   safe. A place in it is reserved first by a compare-and-swap on the waiter count, which
//!   never goes above its bound, however many requests race for the last place.
//! * **Keys.** A key's gate lives in the crate's keyed table while anyone holds, waits for or is about
//!   to ask for one of its permits (its `users`). The last one to leave removes it, under the
//!   shard's lock, so the table holds no more keys than there are requests in flight or
//!   waiting.

use std::hash::Hash;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;

use super::control::{Control, GateCtl, Priority};
use crate::keyed::{Absent, Entry, OnFull, Table};

/// A place among the requests in flight, given back when dropped.
pub(crate) struct Permit {
    gate: Arc<Gate>,
    /// For an adaptive limit: when it was taken, and what the sample will say.
    measure: Option<Measure>,
    /// Its place in the in-flight gauge.
    held: crate::observe::Held,
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
        Permit {
            gate,
            measure,
            held: crate::observe::Held::default(),
        }
    }

    /// Counts the permit in the layer's in-flight gauge while it is held.
    #[inline]
    pub(crate) fn held(&mut self, held: crate::observe::Held) {
        self.held = held;
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
    /// Brings the semaphore to the layer's current limit now (after a change while serving,
    /// so that waiters get the places a higher limit opens without waiting for traffic).
    fn sync(&self) {
        if let Some(ctl) = &self.ctl {
            ctl.sync(&self.sem);
        }
    }

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
    ///
    /// A permit that reaches it while a lowered limit still owes permits pays that debt, and
    /// the waiter waits again (behind those who came after it: the limit in force comes
    /// first).
    pub(crate) async fn acquire(mut self, max_wait: Duration) -> Option<Permit> {
        let gate = self.0.as_ref()?;
        let handed = async {
            loop {
                // The semaphore is never closed.
                gate.sem.acquire().await.ok()?.forget();
                match &gate.ctl {
                    Some(ctl) if ctl.owed(&gate.sem) => continue,
                    _ => return Some(()),
                }
            }
        };
        match tokio::time::timeout(max_wait, handed).await {
            Ok(Some(())) => {}
            // The timeout. Dropping `self` leaves.
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
#[derive(Clone)]
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

    /// Follows a changed limit now.
    pub(crate) fn sync(&self) {
        self.0.sync();
    }

    pub(crate) fn waiting(&self) -> usize {
        self.0.waiting()
    }
}

impl Entry for Arc<Gate> {
    /// A gate is in the table only while someone uses it; the last one to leave removes it.
    fn idle_at(&self) -> u64 {
        u64::MAX
    }

    fn evictable(&self, _now: u64) -> bool {
        false
    }
}

/// Per-key limits: a gate for each key that has requests in flight or waiting, on the crate's
/// keyed table (unbounded by count: it holds no more keys than requests in flight or waiting).
pub(crate) struct KeyedLimit<K> {
    table: Table<K, Arc<Gate>>,
    max: usize,
    /// One adaptive limit (or priorities) shared by every key's gate.
    control: Option<Arc<Control>>,
}

impl<K: Hash + Eq + Clone + Send + Sync + 'static> KeyedLimit<K> {
    pub(crate) fn new(max: usize, control: Option<Arc<Control>>) -> Arc<Self> {
        Arc::new(KeyedLimit {
            table: Table::new(usize::MAX, OnFull::RejectNewKeys),
            max,
            control,
        })
    }

    /// Tries to take a permit of `key`'s gate, creating it if the key is new.
    #[inline]
    pub(crate) fn try_acquire(
        self: &Arc<Self>,
        key: K,
        queue: Option<usize>,
        priority: Priority,
    ) -> Attempt {
        let Some(gate) = self.visit(&key) else {
            return Attempt::Busy;
        };
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

    /// Finds or creates the gate of `key` and counts this request among its users, under the
    /// table's lock.
    fn visit(self: &Arc<Self>, key: &K) -> Option<Arc<Gate>> {
        let hash = self.table.hash(key);
        let join = |gate: &Arc<Gate>| {
            if let Some(k) = &gate.key {
                k.users.fetch_add(1, Ordering::AcqRel);
            }
            gate.clone()
        };
        self.table
            .upsert(
                hash,
                key,
                false,
                || 0,
                |gate, _| join(gate),
                |_| {
                    let key_state = KeyState {
                        hash,
                        users: AtomicUsize::new(0),
                        table: self.clone(),
                    };
                    let gate =
                        Arc::new(Gate::new(self.max, Some(key_state), self.control.as_ref()));
                    Absent::Insert(join(&gate), gate)
                },
            )
            .ok()
    }

    /// Follows a changed limit now, on every key's gate.
    pub(crate) fn sync(&self) {
        self.table.for_each(|_, g| g.sync());
    }

    /// Keys with requests in flight or waiting.
    pub(crate) fn len(&self) -> usize {
        self.table.len()
    }

    pub(crate) fn in_flight(&self) -> usize {
        let mut n = 0;
        self.table.for_each(|_, g| n += g.in_flight());
        n
    }

    pub(crate) fn waiting(&self) -> usize {
        let mut n = 0;
        self.table.for_each(|_, g| n += g.waiting());
        n
    }
}

impl<K: Hash + Eq + Clone + Send + Sync + 'static> Forget for KeyedLimit<K> {
    fn remove_if_unused(&self, gate: &Gate) {
        let Some(state) = &gate.key else { return };
        // Someone may have found the gate and joined it since its count reached zero: the
        // count is read again under the table's lock, where joins happen.
        self.table.remove_if(state.hash, |_, g| {
            std::ptr::eq(&**g, gate) && state.users.load(Ordering::Acquire) == 0
        });
    }
}
