//! What a value tells the table about itself.

/// A value kept in a [`Table`](super::Table), seen by the table only through these questions.
///
/// Times are nanoseconds on the owner's clock.
pub(crate) trait Entry {
    /// The lowest [`rank`](Self::rank) a value of this type can have.
    const MIN_RANK: u8 = 0;

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

    /// How much the value is worth keeping at `now`, when it is not idle: room for a new key is
    /// made by evicting the lowest rank first (the nearest to idle among equals), and never a
    /// value of a higher rank than the one to insert, unless that rank is at most
    /// [`GIVES_WAY_TO_ANY`](super::bound::GIVES_WAY_TO_ANY). Every value is of rank 0 unless
    /// its type says otherwise.
    fn rank(&self, _now: u64) -> u8 {
        0
    }
}
