//! What `tracing` events write, captured for a test to read.
#![allow(dead_code)]

use std::io;
use std::sync::{Arc, Mutex};

/// A writer for `tracing_subscriber::fmt` that keeps everything written.
#[derive(Clone, Default)]
pub struct Captured(Arc<Mutex<Vec<u8>>>);

impl io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

impl Captured {
    /// Everything written so far.
    pub fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

/// Captures what `tracing` events at `level` and above write on this thread while the guard
/// lives, whatever other threads of the test binary do at the same time.
///
/// A subscriber set for one thread alone is not enough: `tracing` caches, once per callsite
/// and for the whole process, whether any subscriber wants its events. A callsite first
/// reached on another thread while this thread's subscriber is the only one registered has
/// its interest taken from that thread's (absent) subscriber, "never", and this thread then
/// misses its events. So a quiet subscriber is set once as the process's default: it wants
/// no event itself, but answers "sometimes" for every callsite, so that no callsite is ever
/// cached as wanted by nobody and each event asks the subscriber of the thread it runs on.
pub fn capture(level: tracing::Level) -> (Captured, tracing::subscriber::DefaultGuard) {
    let out = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_ansi(false)
        .without_time()
        .with_writer(out.clone())
        .finish();
    (out, own(subscriber))
}

/// Makes `subscriber` this thread's own while the guard lives, for a test that needs a
/// subscriber of its own rather than [`capture`]'s text: [`quiet`] first, so that the race
/// [`capture`] describes cannot take an event from it either.
pub fn own<S>(subscriber: S) -> tracing::subscriber::DefaultGuard
where
    S: tracing::Subscriber + Send + Sync + 'static,
{
    quiet();
    let guard = tracing::subscriber::set_default(subscriber);
    tracing::callsite::rebuild_interest_cache();
    guard
}

/// Sets the quiet subscriber (see [`capture`]) as the process's default, once per process;
/// every test that sets a subscriber of its own for one thread calls it first (through
/// [`capture`] or [`own`]).
pub fn quiet() {
    static QUIET: std::sync::Once = std::sync::Once::new();
    QUIET.call_once(|| {
        // Another default set first (none in these binaries) would decide instead.
        let _ = tracing::subscriber::set_global_default(Quiet);
    });
}

/// The process's default subscriber in a test binary that captures events (see [`capture`]):
/// interested in every callsite "sometimes", enabled for none.
struct Quiet;

impl tracing::Subscriber for Quiet {
    fn register_callsite(
        &self,
        _: &'static tracing::Metadata<'static>,
    ) -> tracing::subscriber::Interest {
        tracing::subscriber::Interest::sometimes()
    }
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        false
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, _: &tracing::Event<'_>) {}
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}
