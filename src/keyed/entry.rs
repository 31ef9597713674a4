//! What a value tells the table about itself.

/// A value kept in a [`Table`](super::Table), seen by the table only through these questions.
///
/// Times are nanoseconds on the owner's clock.
pub(crate) trait Entry {
    /// The earliest time at which the value may be idle (its state equal to "never seen", so
    /// that forgetting it changes no decision), if nothing else happens to it. It must never be
    /// later than the true time: the table uses the smallest of these to know when a sweep can
    /// find something to drop. `u64::MAX` for a value that never goes idle by itself.
    fn idle_at(&self) -> u64;

    /// Whether the value is idle at `now`.
    fn is_idle(&self, now: u64) -> bool {
        self.idle_at() <= now
    }

    /// Whether the value may be forgotten at `now` while it is not idle, to make room for a
    /// new key under [`OnFull::EvictNearestIdle`](super::OnFull::EvictNearestIdle).
    fn evictable(&self, _now: u64) -> bool {
        true
    }
}
