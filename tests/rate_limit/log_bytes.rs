//! The sliding log's byte bound in memory, measured with a counting allocator: one entry of
//! 16 bytes per request whatever its cost, a buffer never more than four times what it holds
//! (and 16 entries), and memory given back as the log shrinks, not only once it is empty.
//!
//! Pins docs/design.md section 1 ("Other kinds": the sliding log) and section 3 ("Keyed state").

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use crate::common;

use common::account::rig::{Reply, Rig};
use tollgate::key::Header;
use tollgate::rate_limit::settle::ActualCost;
use tollgate::{Clock, Policy, Quota, RateLimitLayer, RateLimiter};
use tower::Layer;

struct Counting;

static HELD: AtomicIsize = AtomicIsize::new(0);
/// One measurement at a time: the counter is global.
static ONE: Mutex<()> = Mutex::new(());

thread_local! {
    /// Whether this thread's allocations are counted: only the measuring test's, so that
    /// the harness's other threads (starting the next test, printing) add nothing.
    static COUNTED: Cell<bool> = const { Cell::new(false) };
}

fn counted() -> bool {
    COUNTED.try_with(Cell::get).unwrap_or(false)
}

/// Counts this thread's allocations until dropped.
struct Measuring;

impl Measuring {
    fn start() -> Self {
        COUNTED.with(|c| c.set(true));
        Measuring
    }
}

impl Drop for Measuring {
    fn drop(&mut self) {
        COUNTED.with(|c| c.set(false));
    }
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if counted() {
            HELD.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if counted() {
            HELD.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        }
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if counted() {
            HELD.fetch_add(
                new_size as isize - layout.size() as isize,
                Ordering::Relaxed,
            );
        }
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static A: Counting = Counting;

fn held() -> isize {
    HELD.load(Ordering::Relaxed)
}

const DAY: Duration = Duration::from_secs(86_400);

#[test]
fn a_log_of_ten_thousand_requests_holds_at_most_sixteen_bytes_each_and_shrinks_with_them() {
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    let _measuring = Measuring::start();
    let (clock, time) = Clock::manual();
    let l = RateLimiter::<u64>::builder(Quota::sliding_log(10_000, Duration::from_secs(10)))
        .clock(clock)
        .max_keys(16)
        .build();
    assert!(l.check(&1).is_allowed());
    let one = held();
    for _ in 1..10_000 {
        time.advance(Duration::from_micros(100));
        assert!(l.check(&1).is_allowed());
    }
    let full = held() - one;
    println!("sliding log, 10 000 requests of cost 1: {full} bytes more than with one");
    // 16 bytes an entry; the buffer is a power of two (16 384 entries).
    assert!(full <= 16 * 16_384, "{full}");
    // Once all but two have left the window, the buffer is at most 16 entries again.
    time.advance(Duration::from_secs(10) - Duration::from_micros(150));
    assert!(l.check(&1).is_allowed());
    let shrunk = held() - one;
    println!("sliding log, 3 entries left: {shrunk} bytes more than with one");
    // A buffer of at most 16 entries (256 bytes) and what the table keeps beside it.
    assert!(shrunk <= 512, "{shrunk}");
}

#[test]
fn five_settlements_of_ten_thousand_and_one_add_one_entry_each() {
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    let _measuring = Measuring::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(settle_five());
}

async fn settle_five() {
    let (clock, _time) = Clock::manual();
    let layer = RateLimitLayer::new(Policy::new("tokens", Quota::sliding_log(10_000, DAY)))
        .key(Header::new("x-key"))
        .clock(clock)
        .cost(|_| 1)
        .settle(ActualCost::of);
    let mut rig = Rig::new(|h| layer.layer(h));
    // Five requests in flight on each of two keys; those of "small" settle at their cost,
    // those of "huge" at 10 001 each. What came with "huge" is that key whole.
    let mut held_after = Vec::new();
    for (key, actual) in [("small", 1), ("huge", 10_001)] {
        let mut ids = Vec::new();
        for _ in 0..5 {
            ids.push(rig.send(key, 1).await.unwrap());
        }
        for id in ids {
            let reply = Reply {
                status: 200,
                actual: Some(actual),
            };
            rig.answer(id, reply).await;
        }
        held_after.push(held());
    }
    let grown = held_after[1] - held_after[0];
    println!("sliding log, a key with five settlements of 10 001: {grown} bytes");
    // Its slot, its key, ten entries of 16 bytes and any growth of the table: no more than
    // one entry per request or settlement, whatever the costs (640 256 bytes when the log
    // kept one entry per unit).
    assert!(grown < 4_096, "{grown}");
}
