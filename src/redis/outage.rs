//! Logging of Redis outages: a few lines per outage, never one per request.
//!
//! The first error of an outage is logged at once; while errors go on, at most one summary line
//! per interval counts them; the first success after errors says that Redis is back.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often, at most, an ongoing outage is logged again.
pub(crate) const SUMMARY_INTERVAL: Duration = Duration::from_secs(10);

/// What to log after an event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Line {
    /// The first error of an outage.
    Down,
    /// The outage goes on: `errors` more since the last line.
    StillDown { errors: u64 },
    /// The first success after an outage of `lasted`, with `errors` errors since the last line.
    Back { lasted: Duration, errors: u64 },
}

#[derive(Debug)]
struct State {
    since: Instant,
    last_line: Instant,
    /// Errors not yet reported.
    errors: u64,
    /// With probing (`RedisStore::probe_every`): when the next call may try Redis.
    next_probe: Option<Instant>,
}

/// Outage bookkeeping shared by every clone of a store.
#[derive(Debug, Default)]
pub(crate) struct Outage {
    /// Fast path for successes: no lock unless an outage is on.
    down: AtomicBool,
    state: Mutex<Option<State>>,
}

impl Outage {
    /// Records an error at `now`; returns the line to log, if any.
    pub(crate) fn error(&self, now: Instant, interval: Duration) -> Option<Line> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match &mut *state {
            None => {
                *state = Some(State {
                    since: now,
                    last_line: now,
                    errors: 0,
                    next_probe: None,
                });
                self.down.store(true, Ordering::Release);
                Some(Line::Down)
            }
            Some(s) => {
                s.errors += 1;
                if now.saturating_duration_since(s.last_line) >= interval {
                    let errors = std::mem::take(&mut s.errors);
                    s.last_line = now;
                    Some(Line::StillDown { errors })
                } else {
                    None
                }
            }
        }
    }

    /// Whether a call at `now` may try Redis when calls probe at most once per `every` during
    /// an outage: always outside one; during one, the first call at or after the time set by
    /// the previous probe (the first error sets it `every` later), and no other.
    pub(crate) fn may_call(&self, now: Instant, every: Duration) -> bool {
        if !self.down.load(Ordering::Acquire) {
            return true;
        }
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let Some(s) = &mut *state else {
            return true;
        };
        let due = *s.next_probe.get_or_insert(s.since + every);
        if now < due {
            return false;
        }
        s.next_probe = Some(now + every);
        true
    }

    /// Whether the latest call failed (an outage is on).
    #[inline]
    pub(crate) fn is_down(&self) -> bool {
        self.down.load(Ordering::Acquire)
    }

    /// Records a success at `now`; returns the line to log, if any.
    #[inline]
    pub(crate) fn success(&self, now: impl FnOnce() -> Instant) -> Option<Line> {
        if !self.down.load(Ordering::Acquire) {
            return None;
        }
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        self.down.store(false, Ordering::Release);
        state.take().map(|s| Line::Back {
            lasted: now().saturating_duration_since(s.since),
            errors: s.errors,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outage_logs_its_start_one_summary_per_interval_and_its_end() {
        let o = Outage::default();
        let t0 = Instant::now();
        let i = Duration::from_secs(10);
        let at = |ms| t0 + Duration::from_millis(ms);
        assert_eq!(o.success(|| at(0)), None);
        assert_eq!(o.error(at(0), i), Some(Line::Down));
        let lines: Vec<_> = (1..=2000).filter_map(|n| o.error(at(n * 10), i)).collect();
        // 2000 more errors over 20 s: two summaries, at 10 s and 20 s.
        assert_eq!(
            lines,
            vec![
                Line::StillDown { errors: 1000 },
                Line::StillDown { errors: 1000 }
            ]
        );
        assert_eq!(o.error(at(20_001), i), None);
        assert_eq!(
            o.success(|| at(21_000)),
            Some(Line::Back {
                lasted: Duration::from_secs(21),
                errors: 1
            })
        );
        assert_eq!(o.success(|| at(21_001)), None);
        assert_eq!(o.error(at(30_000), i), Some(Line::Down));
    }
}
