//! The table of cases for docs/design.md section 1 ("Quota" and "GCRA decision").
//!
//! Every store and front end runs this one table: the in-memory `RateLimiter`, the HTTP layer,
//! and any other store. Times are milliseconds since the first request; each step is one
//! decision for `key` with `cost`, and states what must come back.

#![allow(dead_code)]

use std::time::Duration;

use tollgate::{Outcome, Quota};

/// What one decision must report. `None` fields are not checked.
#[derive(Debug, Clone)]
pub struct Expect {
    pub outcome: Outcome,
    /// Remaining per quota, in policy order.
    pub remaining: Option<Vec<u64>>,
    /// Retry-after in milliseconds (only for `Limited`).
    pub retry_after_ms: Option<u64>,
    /// Reset-after (time to full burst on every quota) in milliseconds.
    pub reset_after_ms: Option<u64>,
}

#[derive(Debug, Clone)]
pub struct Step {
    pub at_ms: u64,
    pub key: &'static str,
    pub cost: u32,
    pub expect: Expect,
}

#[derive(Debug, Clone)]
pub struct Case {
    pub name: &'static str,
    pub quotas: Vec<Quota>,
    pub steps: Vec<Step>,
}

fn step(at_ms: u64, cost: u32, outcome: Outcome) -> Step {
    Step {
        at_ms,
        key: "k",
        cost,
        expect: Expect {
            outcome,
            remaining: None,
            retry_after_ms: None,
            reset_after_ms: None,
        },
    }
}

impl Step {
    fn key(mut self, key: &'static str) -> Self {
        self.key = key;
        self
    }
    fn remaining(mut self, r: &[u64]) -> Self {
        self.expect.remaining = Some(r.to_vec());
        self
    }
    fn retry(mut self, ms: u64) -> Self {
        self.expect.retry_after_ms = Some(ms);
        self
    }
    fn reset(mut self, ms: u64) -> Self {
        self.expect.reset_after_ms = Some(ms);
        self
    }
}

use Outcome::{Allowed as A, Exceeds as X, Limited as L};

/// Every case: GCRA's, then the window kinds', then warm-up's.
pub fn cases() -> Vec<Case> {
    let mut all = gcra_cases();
    all.extend(window_cases());
    all.extend(warm_up_cases());
    all
}

/// The cases of GCRA (docs/design.md section 1).
pub fn gcra_cases() -> Vec<Case> {
    vec![
        Case {
            // Seed 002: 10/s, burst 5, six requests at t=0 -> five allowed (not six).
            name: "seed example: exact burst of five",
            quotas: vec![Quota::per_second(10).burst(5)],
            steps: vec![
                step(0, 1, A).remaining(&[4]).reset(100),
                step(0, 1, A).remaining(&[3]).reset(200),
                step(0, 1, A).remaining(&[2]).reset(300),
                step(0, 1, A).remaining(&[1]).reset(400),
                step(0, 1, A).remaining(&[0]).reset(500),
                step(0, 1, L).remaining(&[0]).retry(100).reset(500),
            ],
        },
        Case {
            name: "one request earned back per emission interval",
            quotas: vec![Quota::per_second(10).burst(5)],
            steps: vec![
                step(0, 5, A).remaining(&[0]),
                step(50, 1, L).retry(50),
                step(100, 1, A).remaining(&[0]).reset(500),
                step(100, 1, L).retry(100),
                // At 350 ms the key is 350 ms ahead of now: 1.5 units free, whole requests 1.
                step(350, 1, A).remaining(&[1]).reset(350),
                step(2000, 1, A).remaining(&[4]).reset(100),
            ],
        },
        Case {
            name: "steady rate without burst",
            quotas: vec![Quota::per_second(1).burst(1)],
            steps: vec![
                step(0, 1, A).remaining(&[0]).reset(1000),
                step(500, 1, L).retry(500).reset(500),
                step(999, 1, L).retry(1),
                step(1000, 1, A),
                step(1000, 1, L).retry(1000),
            ],
        },
        Case {
            name: "quickstart: 1/s burst 5, seven at once",
            quotas: vec![Quota::per_second(1).burst(5)],
            steps: vec![
                step(0, 1, A).remaining(&[4]),
                step(0, 1, A),
                step(0, 1, A),
                step(0, 1, A),
                step(0, 1, A).remaining(&[0]).reset(5000),
                step(0, 1, L).retry(1000).reset(5000),
                step(0, 1, L).retry(1000),
            ],
        },
        Case {
            name: "cost takes several units at once; a rejected cost takes none",
            quotas: vec![Quota::per_second(10).burst(5)],
            steps: vec![
                step(0, 3, A).remaining(&[2]).reset(300),
                step(0, 3, L).retry(100).remaining(&[2]),
                step(0, 2, A).remaining(&[0]).reset(500),
            ],
        },
        Case {
            name: "cost 0 is a peek: reports, consumes nothing",
            quotas: vec![Quota::per_second(10).burst(5)],
            steps: vec![
                step(0, 0, A).remaining(&[5]).reset(0),
                step(0, 2, A).remaining(&[3]),
                step(0, 0, A).remaining(&[3]).reset(200),
                step(0, 3, A).remaining(&[0]),
                step(0, 0, A).remaining(&[0]).reset(500),
                step(0, 1, L).retry(100),
            ],
        },
        Case {
            name: "a cost above the burst can never pass and consumes nothing",
            quotas: vec![Quota::per_second(10).burst(5)],
            steps: vec![
                step(0, 6, X).remaining(&[5]),
                step(0, 5, A).remaining(&[0]),
                step(0, 6, X),
                step(10_000, 6, X),
            ],
        },
        Case {
            name: "keys are independent",
            quotas: vec![Quota::per_second(1).burst(2)],
            steps: vec![
                step(0, 2, A).key("a"),
                step(0, 1, L).key("a").retry(1000),
                step(0, 1, A).key("b").remaining(&[1]),
                step(0, 1, A).key("b").remaining(&[0]),
                step(0, 1, L).key("b"),
            ],
        },
        Case {
            name: "several quotas: all or nothing",
            // A: 10/s burst 2 (T=100ms). B: 3/min burst 3 (T=20s).
            quotas: vec![Quota::per_second(10).burst(2), Quota::per_minute(3)],
            steps: vec![
                step(0, 1, A).remaining(&[1, 2]),
                step(0, 1, A).remaining(&[0, 1]),
                // Rejected by A; B keeps its last unit.
                step(0, 1, L).retry(100).remaining(&[0, 1]),
                step(200, 1, A).remaining(&[1, 0]),
                // Rejected by B (wait until 60s+20s-60s = 20s after t=0 -> 19.8s); A untouched.
                step(400, 1, L).retry(19_600).remaining(&[2, 0]),
                step(20_000, 1, A).remaining(&[1, 0]),
            ],
        },
        Case {
            name: "several quotas: retry after is the longest among the rejecting ones",
            quotas: vec![
                Quota::per_second(1).burst(1),
                Quota::new(1, Duration::from_secs(2)).burst(1),
            ],
            steps: vec![
                step(0, 1, A).reset(2000),
                step(0, 1, L).retry(2000),
                step(1000, 1, L).retry(1000),
                step(2000, 1, A),
            ],
        },
        Case {
            name: "several quotas: a cost above any burst can never pass",
            quotas: vec![Quota::per_second(100).burst(50), Quota::per_minute(10)],
            steps: vec![
                step(0, 11, X).remaining(&[50, 10]),
                step(0, 10, A).remaining(&[40, 0]),
            ],
        },
        Case {
            name: "an idle key is back to its full burst",
            quotas: vec![Quota::per_minute(5)],
            steps: vec![
                step(0, 5, A).remaining(&[0]).reset(60_000),
                // Nearly the whole burst is back: 12.001 s ahead of now, 3 whole requests free.
                step(59_999, 1, A).remaining(&[3]).reset(12_001),
                step(3_600_000, 0, A).remaining(&[5]).reset(0),
                step(3_600_000, 5, A).remaining(&[0]),
            ],
        },
    ]
}

/// Checks one decision against its expectation; returns a description of the mismatch.
pub fn check(case: &Case, i: usize, d: &tollgate::Decision) -> Result<(), String> {
    let s = &case.steps[i];
    let e = &s.expect;
    let ctx = || format!("case {:?}, step {i} ({:?})", case.name, s);
    if d.outcome() != e.outcome {
        return Err(format!("{}: outcome {:?}", ctx(), d.outcome()));
    }
    if let Some(r) = &e.remaining {
        let got: Vec<u64> = d.states().iter().map(|q| q.remaining()).collect();
        if &got != r {
            return Err(format!("{}: remaining {:?}", ctx(), got));
        }
    }
    match (e.outcome, e.retry_after_ms, d.retry_after()) {
        (Outcome::Limited, Some(ms), Some(got)) if got != Duration::from_millis(ms) => {
            return Err(format!("{}: retry_after {:?}", ctx(), got));
        }
        (Outcome::Limited, _, None) => return Err(format!("{}: no retry_after", ctx())),
        (Outcome::Allowed | Outcome::Exceeds, _, Some(got)) => {
            return Err(format!("{}: unexpected retry_after {:?}", ctx(), got));
        }
        _ => {}
    }
    if let Some(ms) = e.reset_after_ms {
        if d.reset_after() != Duration::from_millis(ms) {
            return Err(format!("{}: reset_after {:?}", ctx(), d.reset_after()));
        }
    }
    Ok(())
}

const SEC: Duration = Duration::from_secs(1);

/// The cases of the window kinds (fixed window, sliding log, sliding counter) and of policies
/// that mix kinds. Windows open with a key's first admitted request.
pub fn window_cases() -> Vec<Case> {
    vec![
        Case {
            name: "fixed window: at most N inside a window, all back when it closes",
            quotas: vec![Quota::fixed_window(3, SEC)],
            steps: vec![
                step(0, 1, A).remaining(&[2]).reset(1000),
                step(0, 2, A).remaining(&[0]).reset(1000),
                step(500, 1, L).retry(500).remaining(&[0]).reset(500),
                step(999, 1, L).retry(1),
                // The window closed at 1000; this request opens the next one.
                step(1000, 1, A).remaining(&[2]).reset(1000),
                step(1000, 3, L).retry(1000).remaining(&[2]),
                step(1500, 2, A).remaining(&[0]).reset(500),
                step(5000, 0, A).remaining(&[3]).reset(0),
            ],
        },
        Case {
            name: "fixed window: up to 2N across the boundary of two windows",
            quotas: vec![Quota::fixed_window(2, SEC)],
            steps: vec![
                step(0, 1, A),
                step(999, 1, A).remaining(&[0]).reset(1),
                step(1000, 2, A).remaining(&[0]).reset(1000),
                step(1001, 1, L).retry(999),
            ],
        },
        Case {
            name: "fixed window: a cost above the count never passes and consumes nothing",
            quotas: vec![Quota::fixed_window(3, SEC)],
            steps: vec![
                step(0, 4, X).remaining(&[3]).reset(0),
                step(0, 3, A).remaining(&[0]),
                step(0, 0, A).remaining(&[0]).reset(1000),
            ],
        },
        Case {
            name: "sliding log: at most N in any window, retry when the oldest leaves",
            quotas: vec![Quota::sliding_log(3, SEC)],
            steps: vec![
                step(0, 1, A).remaining(&[2]).reset(1000),
                step(200, 1, A).remaining(&[1]).reset(1000),
                step(400, 1, A).remaining(&[0]).reset(1000),
                // The request of 0 leaves the window at 1000, that of 200 at 1200.
                step(600, 1, L).retry(400).remaining(&[0]).reset(800),
                step(600, 2, L).retry(600),
                step(1000, 1, A).remaining(&[0]).reset(1000),
                step(1000, 1, L).retry(200),
                // At 1400 only the request of 1000 is still in the window.
                step(1400, 2, A).remaining(&[0]).reset(1000),
                step(4000, 0, A).remaining(&[3]).reset(0),
                step(4000, 4, X).remaining(&[3]),
            ],
        },
        Case {
            name: "sliding log: a request leaves the window exactly W after it came",
            quotas: vec![Quota::sliding_log(2, SEC)],
            steps: vec![
                step(0, 1, A),
                step(999, 1, A).remaining(&[0]),
                step(1000, 1, A).remaining(&[0]).reset(1000),
                step(1001, 1, L).retry(998),
            ],
        },
        Case {
            name: "sliding counter: the previous window weighs by its overlap",
            quotas: vec![Quota::sliding_window(10, SEC)],
            steps: vec![
                step(0, 5, A).remaining(&[5]).reset(2000),
                step(500, 5, A).remaining(&[0]).reset(1500),
                // Full: in the next window the 10 weigh 10 × (1000 - e) / 1000, and one more
                // fits once that is 9, at e = 100.
                step(900, 1, L).retry(200).remaining(&[0]).reset(1100),
                step(1000, 1, L).retry(100).remaining(&[0]).reset(1000),
                step(1100, 1, A).remaining(&[0]).reset(1900),
                // At 1550 the previous window weighs 4.5: room for 4 beside the 1 counted.
                step(1550, 4, A).remaining(&[0]).reset(1450),
                step(1550, 1, L).retry(50),
                step(1600, 1, A).remaining(&[0]),
                step(5000, 0, A).remaining(&[10]).reset(0),
                step(5000, 11, X).remaining(&[10]),
            ],
        },
        Case {
            name: "mixed kinds: a GCRA rejection consumes nothing from the log, and back",
            quotas: vec![
                Quota::per_second(10).burst(2),
                Quota::sliding_log(3, Duration::from_secs(10)),
            ],
            steps: vec![
                step(0, 1, A).remaining(&[1, 2]),
                step(0, 1, A).remaining(&[0, 1]),
                step(0, 1, L).retry(100).remaining(&[0, 1]),
                step(200, 1, A).remaining(&[1, 0]),
                // The log rejects; GCRA keeps what it had.
                step(400, 1, L).retry(9600).remaining(&[2, 0]),
                step(10_000, 1, A).remaining(&[1, 1]).reset(10_000),
            ],
        },
        Case {
            name: "mixed kinds: fixed window and sliding counter, all or nothing",
            quotas: vec![
                Quota::fixed_window(2, SEC),
                Quota::sliding_window(3, Duration::from_secs(3)),
            ],
            steps: vec![
                step(0, 2, A).remaining(&[0, 1]),
                step(500, 1, L).retry(500).remaining(&[0, 1]),
                step(1000, 1, A).remaining(&[1, 0]),
                // The counter rejects until its 3 weigh 2 in its next window (at 4000 ms);
                // the fixed window keeps its last unit.
                step(1000, 1, L).retry(3000).remaining(&[1, 0]),
                step(1000, 1, L).retry(3000).remaining(&[1, 0]),
            ],
        },
    ]
}

/// 1 per second warming up over 4 s with cold factor 3: `T` = 1 s, threshold 2 s, warm zone
/// 2 s, an idle key stores 4 s of permits, and taking `k` from `a` above the threshold costs
/// `k·T + (a² − (a − k)²) / 2` (in seconds). From cold: 2.5 s, 1.5 s, then 1 s.
fn warm(burst: u32) -> Quota {
    Quota::per_second(1)
        .burst(burst)
        .warm_up(Duration::from_secs(4), 3)
}

/// The cases of GCRA with warm-up (src/algo/warmup.rs).
pub fn warm_up_cases() -> Vec<Case> {
    vec![
        Case {
            name: "warm-up, burst 1: spaced 2.5 s, 1.5 s, then 1 s after idle",
            quotas: vec![warm(1)],
            steps: vec![
                step(0, 1, A).remaining(&[0]).reset(2500),
                step(0, 1, L).retry(2500),
                step(2499, 1, L).retry(1),
                step(2500, 1, A).remaining(&[0]).reset(1500),
                step(4000, 1, A).reset(1000),
                step(5000, 1, A).reset(1000),
                step(5500, 1, L).retry(500),
            ],
        },
        Case {
            name: "warm-up: a cold key admits a shorter burst than a warm one",
            quotas: vec![warm(4)],
            steps: vec![
                // Cold: the second request already uses 2.5 s of the 4 s tolerance.
                step(0, 0, A).remaining(&[2]).reset(0),
                step(0, 1, A).remaining(&[1]).reset(2500),
                step(0, 1, A).remaining(&[0]).reset(4000),
                step(0, 1, L).retry(1000),
                // Warm at 4 s (2 s stored, the threshold): the whole burst of 4.
                step(4000, 0, A).remaining(&[4]),
                step(4000, 4, A).remaining(&[0]).reset(4000),
                // Idle for the warm-up period after 8 s: cold again.
                step(12000, 0, A).remaining(&[2]).reset(0),
            ],
        },
        Case {
            name: "warm-up: idle after partial warm-up resumes part way up",
            quotas: vec![warm(1)],
            steps: vec![
                step(0, 1, A),
                step(2500, 1, A),
                step(4000, 1, A),
                step(5000, 1, A).reset(1000),
                // Idle 3 s from 6 s: 3 s of permits, 1 s above the threshold: 1.5 s.
                step(9000, 1, A).reset(1500),
                step(10000, 1, L).retry(500),
                step(10500, 1, A).reset(1000),
            ],
        },
        Case {
            name: "warm-up: cost above the burst never passes, cost 0 consumes nothing",
            quotas: vec![warm(2)],
            steps: vec![
                step(0, 3, X),
                step(0, 0, A).remaining(&[1]),
                // Two at once from cold: the whole warm zone, 2 s + 2 s.
                step(0, 2, A).remaining(&[0]).reset(4000),
                step(2000, 1, L).retry(1000),
                step(3000, 1, A).reset(2000),
            ],
        },
        Case {
            name: "warm-up with cold factor 1 is plain GCRA (seed example)",
            quotas: vec![Quota::per_second(10)
                .burst(5)
                .warm_up(Duration::from_secs(1), 1)],
            steps: vec![
                step(0, 1, A).remaining(&[4]).reset(100),
                step(0, 1, A).remaining(&[3]).reset(200),
                step(0, 1, A).remaining(&[2]).reset(300),
                step(0, 1, A).remaining(&[1]).reset(400),
                step(0, 1, A).remaining(&[0]).reset(500),
                step(0, 1, L).remaining(&[0]).retry(100).reset(500),
            ],
        },
        Case {
            name: "warm-up beside plain GCRA, all or nothing",
            quotas: vec![warm(1), Quota::per_minute(3)],
            steps: vec![
                step(0, 1, A).remaining(&[0, 2]),
                step(2500, 1, A).remaining(&[0, 1]),
                step(4000, 1, A).remaining(&[0, 0]),
                // The minute quota rejects: the warm-up quota is not charged either.
                step(5000, 1, L).retry(15000),
                // Idle long enough to be cold again: 2.5 s for the warm-up quota.
                step(20000, 1, A).remaining(&[0, 0]).reset(60000),
                step(22499, 1, L).retry(17501),
            ],
        },
    ]
}
