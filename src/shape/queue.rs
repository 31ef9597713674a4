//! The schedule of one key: a first-in-first-out queue of waiters, served one per interval.
//!
//! Pure bookkeeping over clock nanoseconds: no clock, no timer, no lock. The shaper holds one
//! [`Queue`] per key behind a mutex; the waiter futures call into it.
//!
//! # Model
//!
//! Every request that joins gets a *virtual time* `v`, as in GCRA: the first after idle gets
//! `now`, each later one `T` more than the one before it. A request may leave once
//! `v - tau <= now` (`tau` = no-delay burst × `T`). The queue stores only `next`, the virtual
//! time the next newcomer would get; the waiter at position `i` has
//! `v = next - (len - i)·T`. Positions, not stored times, give each waiter its slot, so:
//!
//! * **Leaving** (the head, at its slot) pops the front; the new head's `v` is one `T` later.
//! * **Cancelling** (any waiter) removes it and takes `T` off `next`: everyone behind moves
//!   up one slot, and the slot the cancelled waiter held goes to the one behind it. The last
//!   waiter to go away leaves `next` where the last departure put it (`left`): one interval
//!   after the last request to leave, as if nobody had joined since.
//! * Only the head needs a timer. Whoever makes a new head (by leaving or cancelling) wakes it.
//! * **Warm-up.** With a warm-up curve, each request's spacing is its price on the curve
//!   (see [`WarmUp`](crate::warmup::WarmUp)): each waiter keeps the price it was given when it joined, the
//!   queue keeps their sum, and the virtual time of the waiter at position `i` is `next`
//!   minus the prices from `i` on. A cancelled waiter takes its price off `next`; the warm-up
//!   it brought is kept. Without warm-up every price is `T` and the arithmetic is the plain
//!   one above.
//! * **Catch-up.** A head that leaves late (a coarse timer tick, a busy runtime) leaves at once,
//!   and so may the waiters behind it whose slots have passed: the average rate holds. A
//!   schedule that fell more than `catch_up` behind is moved forward first, so a stall never
//!   turns into a burst larger than `catch_up / T`.

use std::collections::VecDeque;
use std::task::Waker;

use crate::algo::warmup::Curve;

/// The timing of a shaper, in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Timing {
    /// `T`, the emission interval.
    pub(crate) interval: u64,
    /// `tau`: how far ahead of its slot a request may leave (no-delay burst × `T`).
    pub(crate) ahead: u64,
    /// How far behind `now` the schedule may lag and still be caught up.
    pub(crate) catch_up: u64,
    /// The warm-up curve, if the spacing follows one.
    pub(crate) warm: Option<Curve>,
}

impl Timing {
    /// Time until a key with `deficit`, idle from its last slot, is fully cold.
    fn cold_in(&self, deficit: u64) -> u64 {
        self.warm.as_ref().map_or(0, |c| c.cold_in(deficit))
    }
}

/// Admission bounds, in requests and nanoseconds. `None`: no bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Bounds {
    /// The most requests that may be waiting (not counting those whose slot has come).
    pub(crate) max_queue: Option<u64>,
    /// The longest a request may be made to wait.
    pub(crate) max_delay: Option<u64>,
}

/// What [`Queue::join`] decided for a newcomer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Join {
    /// It leaves now, without joining the queue.
    Leave,
    /// It joined the queue with this ticket.
    Wait(u64),
    /// The queue is full; a place frees in this many nanoseconds.
    Full(u64),
}

/// What a waiter learns when it asks for its turn.
#[derive(Debug)]
pub(crate) enum Turn {
    /// It left the queue; wake this waiter (the new head) if any.
    Leave(Option<Waker>),
    /// It is the head and leaves at this time.
    At(u64),
    /// Someone is ahead of it; it will be woken.
    Behind,
}

#[derive(Debug)]
struct Waiter {
    ticket: u64,
    waker: Option<Waker>,
    /// The time this waiter's slot adds to the schedule: `T`, or its warm-up price.
    price: u64,
}

/// The queue of one key.
#[derive(Debug, Default)]
pub(crate) struct Queue {
    /// The virtual time of the next newcomer (GCRA's theoretical arrival time).
    next: u64,
    /// Waiters that have not left, oldest first; tickets increase from front to back.
    waiters: VecDeque<Waiter>,
    /// The ticket of the next waiter to join.
    ticket: u64,
    /// The interval `next` was spaced with (0: not yet); see [`Queue::follow`].
    spaced: u64,
    /// The sum of the waiters' prices (`len × T` without warm-up).
    queued: u64,
    /// Warm-up: stored permits below the most a key may store, in time (0: fully cold).
    deficit: u64,
    /// Without warm-up: the virtual time a newcomer would get had nobody joined since the last
    /// departure, i.e. one interval after the last request to leave (0: none yet). Re-spaced
    /// with `next` by [`Queue::follow`]; while nobody waits it equals `next`. A change of rate
    /// keeps the head's slot, which is then no longer one interval after the last departure:
    /// when the last waiter goes away, `next` comes back here, not to that slot.
    left: u64,
}

impl Queue {
    /// An idle queue.
    pub(crate) fn new() -> Self {
        Queue::default()
    }

    fn len(&self) -> u64 {
        self.waiters.len() as u64
    }

    /// Re-spaces the schedule after the shaper's interval changed while serving: the head
    /// keeps its virtual time (its place and its slot) and every waiter is re-priced at the new
    /// interval, so those behind the head follow one new interval apart; with nobody waiting,
    /// the next newcomer comes one new interval after the last one to leave, and so does
    /// `left` whoever waits. Called under the queue's lock before anything reads positions.
    /// (A shaper with warm-up never changes its interval, so every price here is the interval.)
    fn follow(&mut self, t: &Timing) {
        if self.spaced == t.interval {
            return;
        }
        let (old, new) = (self.spaced, t.interval);
        if self.spaced != 0 && self.left != 0 {
            self.left = self.left.saturating_sub(old).saturating_add(new);
        }
        if self.spaced != 0 && self.next != 0 {
            if self.waiters.is_empty() {
                self.next = self.next.saturating_sub(old).saturating_add(new);
            } else {
                let head = self.next.saturating_sub(self.queued);
                for w in &mut self.waiters {
                    w.price = new;
                }
                self.queued = self.len().saturating_mul(new);
                self.next = head.saturating_add(self.queued);
            }
        }
        self.spaced = t.interval;
    }

    /// The virtual time of the waiter at `pos`.
    fn virtual_at(&self, t: &Timing, pos: u64) -> u64 {
        if t.warm.is_none() {
            let behind = self.len().saturating_sub(pos);
            return self.next.saturating_sub(behind.saturating_mul(t.interval));
        }
        let behind: u64 = self
            .waiters
            .iter()
            .skip(usize::try_from(pos).unwrap_or(usize::MAX))
            .map(|w| w.price)
            .sum();
        self.next.saturating_sub(behind)
    }

    /// The virtual time a newcomer would get, and the warm-up deficit it would see.
    fn newcomer(&self, t: &Timing, now: u64) -> (u64, u64) {
        if self.waiters.is_empty() && self.next < now {
            // Idle since `next`: an idle key cools down.
            let deficit = match &t.warm {
                Some(c) => c.regain(self.deficit, now - self.next),
                None => self.deficit,
            };
            (now, deficit)
        } else {
            (self.next, self.deficit)
        }
    }

    /// Waiters whose slot has not come yet.
    fn waiting(&self, t: &Timing, now: u64) -> u64 {
        let len = self.len();
        let head = self.next.saturating_sub(self.queued);
        if len == 0 || head.saturating_sub(t.ahead) > now {
            return len;
        }
        if t.warm.is_none() {
            let due = (now - head.saturating_sub(t.ahead)) / t.interval + 1;
            return len - due.min(len);
        }
        let mut v = head;
        let mut due = 0;
        for w in &self.waiters {
            if v.saturating_sub(t.ahead) > now {
                break;
            }
            due += 1;
            v = v.saturating_add(w.price);
        }
        len - due
    }

    /// The price of a newcomer that sees `deficit` (the time it adds to the schedule), and the
    /// deficit after it.
    fn spacing(t: &Timing, deficit: u64) -> (u64, u64) {
        match &t.warm {
            Some(c) => c.price(deficit, 1),
            None => (t.interval, deficit),
        }
    }

    /// Admits a newcomer at `now`, within `bounds` when given.
    ///
    /// With `leave_now`, a newcomer that nobody is ahead of and whose slot has come leaves at
    /// once instead of joining.
    pub(crate) fn join(
        &mut self,
        t: &Timing,
        bounds: Option<&Bounds>,
        now: u64,
        leave_now: bool,
    ) -> Join {
        self.follow(t);
        let (v, deficit) = self.newcomer(t, now);
        let slot = v.saturating_sub(t.ahead);
        let wait = slot.saturating_sub(now);
        if wait > 0 {
            if let Some(b) = bounds {
                if let Some(retry) = self.refusal(t, b, now, slot, wait) {
                    return Join::Full(retry);
                }
            }
        }
        let (price, deficit) = Self::spacing(t, deficit);
        self.deficit = deficit;
        self.next = v.saturating_add(price);
        if leave_now && wait == 0 && self.waiters.is_empty() {
            self.left = self.next;
            return Join::Leave;
        }
        let ticket = self.ticket;
        self.ticket += 1;
        self.queued = self.queued.saturating_add(price);
        self.waiters.push_back(Waiter {
            ticket,
            waker: None,
            price,
        });
        Join::Wait(ticket)
    }

    /// Why a newcomer that would wait until `slot` cannot join: the time until a place frees.
    fn refusal(&self, t: &Timing, b: &Bounds, now: u64, slot: u64, wait: u64) -> Option<u64> {
        let mut retry = None;
        if let Some(max) = b.max_queue {
            let waiting = self.waiting(t, now);
            if waiting >= max {
                // A place frees when the first waiting request's slot comes.
                let first = if waiting == 0 {
                    slot
                } else {
                    let pos = self.len() - waiting;
                    self.virtual_at(t, pos).saturating_sub(t.ahead)
                };
                retry = Some(first.saturating_sub(now).max(1));
            }
        }
        if let Some(max) = b.max_delay {
            if wait > max {
                let r = wait - max;
                retry = Some(retry.map_or(r, |q: u64| q.max(r)));
            }
        }
        retry
    }

    /// The waiter holding `ticket` asks for its turn at `now`; `waker` is stored if it must wait.
    pub(crate) fn turn(&mut self, t: &Timing, ticket: u64, now: u64, waker: &Waker) -> Turn {
        self.follow(t);
        let Some(pos) = self.position(ticket) else {
            // Only the waiter itself removes its ticket, so this cannot happen; leaving is the
            // answer that cannot hang.
            return Turn::Leave(None);
        };
        if pos == 0 {
            let head = self.next.saturating_sub(self.queued);
            let slot = head.saturating_sub(t.ahead);
            if slot <= now {
                let floor = now.saturating_sub(t.catch_up);
                if head < floor {
                    // Fell behind by more than the catch-up allowance: forfeit the lost slots.
                    self.next = self.next.saturating_add(floor - head);
                }
                if let Some(w) = self.waiters.pop_front() {
                    self.queued = self.queued.saturating_sub(w.price);
                }
                // The new head's virtual time, or `next` when nobody is left.
                self.left = self.next.saturating_sub(self.queued);
                let next_head = self.waiters.front_mut().and_then(|w| w.waker.take());
                return Turn::Leave(next_head);
            }
            self.store_waker(pos, waker);
            return Turn::At(slot);
        }
        self.store_waker(pos, waker);
        Turn::Behind
    }

    /// The waiter holding `ticket` gives up: it leaves the queue and its slot goes to the ones
    /// behind; the last to go away gives the schedule back to the last departure (one interval
    /// after it, at the interval in force). Returns the waker of the new head when the head
    /// gave up.
    pub(crate) fn cancel(&mut self, t: &Timing, ticket: u64) -> Option<Waker> {
        self.follow(t);
        let pos = self.position(ticket)?;
        let price = self.waiters.remove(pos).map_or(0, |w| w.price);
        self.next = self.next.saturating_sub(price);
        self.queued = self.queued.saturating_sub(price);
        if self.waiters.is_empty() && t.warm.is_none() {
            // Without a change of rate this is where `next` already is, or (a waiter that joined
            // an idle key) a time just as past; after a change that kept the head's slot, the
            // slot would stand in for a departure that never happened.
            self.next = self.left;
        }
        if pos == 0 {
            self.waiters.front_mut().and_then(|w| w.waker.take())
        } else {
            None
        }
    }

    fn position(&self, ticket: u64) -> Option<usize> {
        self.waiters
            .binary_search_by_key(&ticket, |w| w.ticket)
            .ok()
    }

    fn store_waker(&mut self, pos: usize, waker: &Waker) {
        if let Some(w) = self.waiters.get_mut(pos) {
            match &mut w.waker {
                Some(old) if old.will_wake(waker) => {}
                slot => *slot = Some(waker.clone()),
            }
        }
    }

    /// Whether the queue decides exactly like an absent one (nothing waiting, schedule past,
    /// and with warm-up, fully cold again).
    pub(crate) fn is_idle(&self, t: &Timing, now: u64) -> bool {
        self.waiters.is_empty() && self.idle_at(t) <= now
    }

    /// When the queue, if nobody joins, decides exactly like an absent one (a lower bound
    /// while someone is waiting).
    pub(crate) fn idle_at(&self, t: &Timing) -> u64 {
        self.next.saturating_add(t.cold_in(self.deficit))
    }

    /// Whether nobody is waiting (the entry may still remember a recent departure).
    pub(crate) fn is_empty(&self) -> bool {
        self.waiters.is_empty()
    }

    /// The virtual time of the next newcomer, for picking eviction victims.
    pub(crate) fn horizon(&self) -> u64 {
        self.next
    }

    /// How many newcomers would be admitted right now, one after another, within `bounds`.
    pub(crate) fn room(&self, t: &Timing, bounds: &Bounds, now: u64) -> u64 {
        let (base, deficit) = self.newcomer(t, now);
        // The j-th newcomer (from 0) has virtual time base + j·T (plus its warm-up surcharge);
        // it may leave at once when that is at most now + tau, and may join when it is at most
        // now + tau + max_delay.
        let count_until = |limit: u64| {
            if base > limit {
                0
            } else {
                match &t.warm {
                    Some(c) => c.fits(deficit, limit - base).saturating_add(1),
                    None => (limit - base) / t.interval + 1,
                }
            }
        };
        let due = count_until(now.saturating_add(t.ahead));
        let mut room = u64::MAX;
        if let Some(max) = bounds.max_queue {
            room = due.saturating_add(max.saturating_sub(self.waiting(t, now)));
        }
        if let Some(max) = bounds.max_delay {
            room = room.min(count_until(now.saturating_add(t.ahead).saturating_add(max)));
        }
        room
    }

    /// Time until the key is idle again, if nothing else joins.
    pub(crate) fn reset_after(&self, now: u64) -> u64 {
        self.next.saturating_sub(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::task::{Wake, Waker};

    const T: u64 = 100;

    fn timing(ahead: u64) -> Timing {
        Timing {
            interval: T,
            ahead: ahead * T,
            catch_up: T,
            warm: None,
        }
    }

    struct Noop;
    impl Wake for Noop {
        fn wake(self: Arc<Self>) {}
    }

    fn waker() -> Waker {
        Waker::from(Arc::new(Noop))
    }

    fn ticket(j: Join) -> u64 {
        match j {
            Join::Wait(t) => t,
            other => panic!("expected to wait, got {other:?}"),
        }
    }

    fn slot(q: &mut Queue, t: &Timing, ticket: u64, now: u64) -> Option<u64> {
        match q.turn(t, ticket, now, &waker()) {
            Turn::At(at) => Some(at),
            Turn::Leave(_) => None,
            Turn::Behind => panic!("ticket {ticket} is not the head"),
        }
    }

    #[test]
    fn first_after_idle_leaves_then_one_per_interval() {
        let t = timing(0);
        let mut q = Queue::new();
        assert_eq!(q.join(&t, None, 1_000, true), Join::Leave);
        let a = ticket(q.join(&t, None, 1_000, true));
        let b = ticket(q.join(&t, None, 1_000, true));
        assert_eq!(slot(&mut q, &t, a, 1_000), Some(1_100));
        assert!(matches!(q.turn(&t, b, 1_000, &waker()), Turn::Behind));
        assert_eq!(slot(&mut q, &t, a, 1_100), None);
        assert_eq!(slot(&mut q, &t, b, 1_100), Some(1_200));
        assert_eq!(slot(&mut q, &t, b, 1_200), None);
        assert!(!q.is_idle(&t, 1_299));
        assert!(q.is_idle(&t, 1_300));
    }

    #[test]
    fn cancelled_waiter_gives_its_slot_to_the_one_behind() {
        let t = timing(0);
        let mut q = Queue::new();
        q.join(&t, None, 0, true);
        let a = ticket(q.join(&t, None, 0, true)); // slot 100
        let b = ticket(q.join(&t, None, 0, true)); // slot 200
        let c = ticket(q.join(&t, None, 0, true)); // slot 300
        q.cancel(&t, b);
        assert_eq!(slot(&mut q, &t, a, 100), None);
        assert_eq!(slot(&mut q, &t, c, 100), Some(200));
        // The head gives up: the next takes its slot.
        let d = ticket(q.join(&t, None, 150, true)); // slot 300
        assert!(q.cancel(&t, c).is_none(), "c never stored a waker");
        assert_eq!(slot(&mut q, &t, d, 150), Some(200));
        assert_eq!(slot(&mut q, &t, d, 200), None);
        assert!(q.is_idle(&t, 300));
    }

    #[test]
    fn cancelling_everything_consumes_nothing() {
        let t = timing(0);
        let mut q = Queue::new();
        let a = ticket(q.join(&t, None, 500, false));
        let b = ticket(q.join(&t, None, 500, false));
        q.cancel(&t, b);
        q.cancel(&t, a);
        assert!(q.is_idle(&t, 500));
    }

    #[test]
    fn no_delay_burst_lets_that_many_go_ahead_of_the_rate() {
        // nginx `delay=2`: after idle, 3 leave at once, then one per T.
        let t = timing(2);
        let mut q = Queue::new();
        for _ in 0..3 {
            assert_eq!(q.join(&t, None, 0, true), Join::Leave);
        }
        let d = ticket(q.join(&t, None, 0, true));
        assert_eq!(slot(&mut q, &t, d, 0), Some(100));
    }

    #[test]
    fn max_queue_counts_waiting_requests_and_says_when_a_place_frees() {
        let t = timing(0);
        let b = Bounds {
            max_queue: Some(2),
            max_delay: None,
        };
        let mut q = Queue::new();
        assert_eq!(q.join(&t, Some(&b), 0, true), Join::Leave);
        let a = ticket(q.join(&t, Some(&b), 0, true)); // slot 100
        ticket(q.join(&t, Some(&b), 0, true)); // slot 200
        assert_eq!(q.room(&t, &b, 30), 0);
        assert_eq!(q.join(&t, Some(&b), 30, true), Join::Full(70));
        // At 100 the head's slot has come: it is no longer waiting, so a place is free.
        assert_eq!(q.room(&t, &b, 100), 1);
        assert_eq!(slot(&mut q, &t, a, 100), None);
        ticket(q.join(&t, Some(&b), 100, true)); // slot 300
        assert_eq!(q.join(&t, Some(&b), 100, true), Join::Full(100));
    }

    #[test]
    fn max_delay_refuses_what_would_wait_too_long() {
        let t = timing(0);
        let b = Bounds {
            max_queue: None,
            max_delay: Some(250),
        };
        let mut q = Queue::new();
        assert_eq!(q.room(&t, &b, 0), 3);
        q.join(&t, Some(&b), 0, true); // now
        q.join(&t, Some(&b), 0, true); // 100
        q.join(&t, Some(&b), 0, true); // 200
        assert_eq!(q.join(&t, Some(&b), 0, true), Join::Full(50));
        assert_eq!(q.room(&t, &b, 50), 1);
    }

    #[test]
    fn a_stalled_schedule_catches_up_at_most_its_allowance() {
        let t = timing(0); // catch_up = T
        let mut q = Queue::new();
        q.join(&t, None, 0, true);
        let tickets: Vec<_> = (0..10).map(|_| ticket(q.join(&t, None, 0, true))).collect();
        // Nobody polled until 1 000: slots 100..=1 000 have passed.
        let mut left = 0;
        for &tk in &tickets {
            if slot(&mut q, &t, tk, 1_000).is_none() {
                left += 1;
            } else {
                break;
            }
        }
        // The head is moved to 900 (now - catch_up): 900 and 1 000 leave, 1 100 does not.
        assert_eq!(left, 2);
        assert_eq!(slot(&mut q, &t, tickets[2], 1_000), Some(1_100));
    }

    /// `timing(0)` at another interval, as after a live change of rate.
    fn every(interval: u64) -> Timing {
        Timing {
            interval,
            ..timing(0)
        }
    }

    /// At 100: `Leave` at 0, then three waiting for 100, 200 and 300.
    fn three_waiting(t: &Timing) -> (Queue, [u64; 3]) {
        let mut q = Queue::new();
        assert_eq!(q.join(t, None, 0, true), Join::Leave);
        let w = [0; 3].map(|_| ticket(q.join(t, None, 0, true)));
        (q, w)
    }

    #[test]
    fn a_change_while_several_wait_keeps_the_head_and_spaces_the_rest_at_the_new_interval() {
        for (new, second) in [(40, 140), (250, 350)] {
            let n = every(new);
            let (mut q, [a, b, c]) = three_waiting(&timing(0));
            assert_eq!(slot(&mut q, &n, a, 10), Some(100));
            assert_eq!(slot(&mut q, &n, a, 100), None);
            assert_eq!(slot(&mut q, &n, b, 100), Some(second));
            assert_eq!(slot(&mut q, &n, b, second), None);
            assert_eq!(slot(&mut q, &n, c, second), Some(second + new));
        }
    }

    #[test]
    fn after_a_change_the_head_giving_up_hands_its_kept_slot_to_the_next() {
        let n = every(40);
        let (mut q, [a, b, c]) = three_waiting(&timing(0));
        q.cancel(&n, a);
        assert_eq!(slot(&mut q, &n, b, 20), Some(100));
        assert_eq!(slot(&mut q, &n, b, 100), None);
        assert_eq!(slot(&mut q, &n, c, 100), Some(140));
    }

    #[test]
    fn after_a_change_a_middle_waiter_giving_up_moves_those_behind_up_one_new_interval() {
        let n = every(40);
        let (mut q, [a, b, c]) = three_waiting(&timing(0));
        q.cancel(&n, b);
        assert_eq!(slot(&mut q, &n, a, 100), None);
        assert_eq!(slot(&mut q, &n, c, 100), Some(140));
    }

    #[test]
    fn after_a_change_the_last_waiters_giving_up_give_the_schedule_back_to_the_last_departure() {
        for (new, cut) in [(40, 40), (100, 100), (250, 250)] {
            let n = every(new);
            // The head first, or the tail first: the queue ends empty either way.
            for order in [[0, 1, 2], [2, 1, 0]] {
                let (mut q, w) = three_waiting(&timing(0));
                for i in order {
                    q.cancel(&n, w[i]);
                }
                // One new interval after the departure at 0.
                assert_eq!(q.horizon(), cut, "one every {new}, order {order:?}");
                assert_eq!(q.reset_after(30), cut - 30);
                assert!(!q.is_idle(&n, cut - 1));
                assert!(q.is_idle(&n, cut));
                let d = ticket(q.join(&n, None, 30, true));
                assert_eq!(slot(&mut q, &n, d, 30), Some(cut));
            }
        }
    }

    #[test]
    fn two_changes_before_a_give_up_space_the_next_from_the_last_departure_at_the_last_rate() {
        // 100 -> 40 -> 250, with the queue read between the changes or not.
        for between in [false, true] {
            let (mut q, [a, b, c]) = three_waiting(&timing(0));
            if between {
                assert_eq!(slot(&mut q, &every(40), a, 10), Some(100));
            }
            let n = every(250);
            for w in [a, b, c] {
                q.cancel(&n, w);
            }
            assert_eq!(q.join(&n, None, 30, true), Join::Wait(3));
            assert_eq!(slot(&mut q, &n, 3, 30), Some(250));
        }
    }

    #[test]
    fn after_a_change_a_kept_slot_that_is_taken_is_the_last_departure() {
        let n = every(40);
        let (mut q, [a, b, c]) = three_waiting(&timing(0));
        assert_eq!(slot(&mut q, &n, a, 100), None);
        q.cancel(&n, b);
        q.cancel(&n, c);
        // a left at 100: the next comes at 140.
        assert_eq!(q.join(&n, None, 110, true), Join::Wait(3));
        assert_eq!(slot(&mut q, &n, 3, 110), Some(140));
    }

    #[test]
    fn after_a_change_and_a_stall_the_last_departure_is_the_caught_up_slot() {
        // catch_up = 100: a head polled at 1 000 for its slot at 100 leaves as if at 900.
        let n = every(40);
        let (mut q, [a, b, c]) = three_waiting(&timing(0));
        assert_eq!(slot(&mut q, &n, a, 1_000), None);
        q.cancel(&n, c);
        q.cancel(&n, b);
        assert_eq!(q.horizon(), 940);
    }

    #[test]
    fn after_a_change_the_bound_counts_those_waiting_and_frees_a_place_at_the_kept_slot() {
        let b = Bounds {
            max_queue: Some(2),
            max_delay: None,
        };
        let n = every(40);
        let mut q = Queue::new();
        assert_eq!(q.join(&timing(0), Some(&b), 0, true), Join::Leave);
        let a = ticket(q.join(&timing(0), Some(&b), 0, true)); // 100
        let c = ticket(q.join(&timing(0), Some(&b), 0, true)); // 200, then 140
        assert_eq!(q.join(&n, Some(&b), 10, true), Join::Full(90));
        assert_eq!(q.room(&n, &b, 10), 0);
        // The head gives up: the next takes its slot, 100, and a place is free.
        q.cancel(&n, a);
        assert_eq!(q.room(&n, &b, 20), 1);
        let d = ticket(q.join(&n, Some(&b), 20, true));
        assert_eq!(q.join(&n, Some(&b), 20, true), Join::Full(80));
        q.cancel(&n, c);
        q.cancel(&n, d);
        // Nobody waits: one new interval after the departure at 0.
        assert_eq!(q.room(&n, &b, 30), 2);
        assert_eq!(q.join(&n, Some(&b), 40, true), Join::Leave);
    }
}
