//! The settings, key resolution, rejections and service shell that every layer of the crate
//! shares ([`RateLimitLayer`](crate::RateLimitLayer),
//! [`ConcurrencyLimitLayer`](crate::ConcurrencyLimitLayer), [`ShapeLayer`](crate::ShapeLayer)).
//!
//! A layer embeds a [`Common`] for the settings its builder shares with the others, and a
//! [`Lazy`] for the state it builds once, when it is first applied; its service embeds the
//! [`Core`] that [`Common::core`] makes of the settings. Changing the key type with `.key()`
//! keeps every setting made before ([`Common::rekey`]); one that cannot follow the new key
//! type is reported when the layer is applied, never dropped in silence.

use std::panic::Location;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};

use http::StatusCode;

use super::allow::AllowList;
use crate::error::ConfigError;
use crate::key::missing::Resolved;
use crate::key::{KeyError, KeyExtractor, MissingKey, RequestHead};
use crate::observe::{DecisionMeter, Names, Observe};
use crate::response::refuse::Refuser;
use crate::response::OnReject;

/// The builder settings every layer has: who a request counts against, what happens to a
/// request without a key, and how rejections are answered.
#[derive(Clone)]
pub(crate) struct Common<E: KeyExtractor> {
    pub(crate) extractor: E,
    on_missing: MissingKey<E::Key>,
    /// A setting that could not follow a change of key type, reported when the layer is built.
    lost: Option<ConfigError>,
    pub(crate) on_reject: Option<OnReject>,
    /// Addresses and keys no limit applies to.
    allow: AllowList<E::Key>,
    /// Settings found invalid when they were made, with the caller's line.
    invalid: Vec<Invalid>,
    /// Dry-run mode and key tracing.
    pub(crate) observe: Observe,
}

/// A setting found invalid when its builder method was called.
#[derive(Debug, Clone)]
struct Invalid {
    setting: &'static str,
    error: ConfigError,
    at: &'static Location<'static>,
}

impl<E: KeyExtractor> Common<E> {
    pub(crate) fn new(extractor: E) -> Self {
        Common {
            extractor,
            on_missing: MissingKey::default(),
            lost: None,
            on_reject: None,
            allow: AllowList::default(),
            invalid: Vec::new(),
            observe: Observe::default(),
        }
    }

    /// Lets requests from the addresses in `cidr` through unlimited, checked at the caller's
    /// line.
    #[track_caller]
    pub(crate) fn allow_ip(&mut self, cidr: &str) {
        let result = self.allow.add_ip(cidr);
        self.note_added("allow_ip", result);
    }

    /// Lets requests whose key is `key` through unlimited.
    pub(crate) fn allow_key(&mut self, key: E::Key) {
        self.allow.add_key(key);
    }

    /// Records whether the value just given to `setting` can work, with the caller's line:
    /// the error is what [`check`](Self::check) reports (a layer's `validate`), and what
    /// applying the layer panics with. Setting it again with a valid value clears it.
    #[track_caller]
    pub(crate) fn note(&mut self, setting: &'static str, result: Result<(), ConfigError>) {
        self.invalid.retain(|i| i.setting != setting);
        if let Err(error) = result {
            let at = Location::caller();
            self.invalid.push(Invalid { setting, error, at });
        }
    }

    /// Records an invalid value given to a setting that adds up (a tier, a quota) rather
    /// than replaces.
    #[track_caller]
    pub(crate) fn note_added(&mut self, setting: &'static str, result: Result<(), ConfigError>) {
        if let Err(error) = result {
            let at = Location::caller();
            self.invalid.push(Invalid { setting, error, at });
        }
    }

    /// Where the setting behind `error` was made, if it was found invalid then.
    pub(crate) fn noted_at(&self, error: &ConfigError) -> Option<&'static Location<'static>> {
        self.invalid
            .iter()
            .find(|i| i.error == *error)
            .map(|i| i.at)
    }

    /// The same settings with another extractor. A missing-key policy that names a key of the
    /// old type (`MissingKey::UseKey`) cannot follow: building the layer then fails with
    /// [`ConfigError::MissingKeyBeforeKey`].
    pub(crate) fn rekey<E2: KeyExtractor>(self, extractor: E2) -> Common<E2> {
        let (allow, keys_lost) = self.allow.rekey();
        let lost = match keys_lost {
            true => self.lost.or(Some(ConfigError::AllowKeyBeforeKey)),
            false => self.lost,
        };
        let (on_missing, lost) = match self.on_missing {
            MissingKey::Reject(status) => (MissingKey::Reject(status), lost),
            MissingKey::Allow => (MissingKey::Allow, lost),
            MissingKey::UseKey(_) => (
                MissingKey::default(),
                lost.or(Some(ConfigError::MissingKeyBeforeKey)),
            ),
        };
        Common {
            extractor,
            on_missing,
            lost,
            on_reject: self.on_reject,
            allow,
            invalid: self.invalid,
            observe: self.observe,
        }
    }

    /// Sets the missing-key policy, checked at the caller's line.
    #[track_caller]
    pub(crate) fn set_on_missing(&mut self, policy: MissingKey<E::Key>) {
        self.note("on_missing_key", policy.validate());
        self.on_missing = policy;
        // Set for the current key type: what an earlier key type lost is replaced, unless
        // it was an allowed key.
        self.lost = self
            .lost
            .take()
            .filter(|e| *e == ConfigError::AllowKeyBeforeKey);
    }

    /// The first setting that cannot work, if any.
    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        if let Some(i) = self.invalid.first() {
            return Err(i.error.clone());
        }
        match &self.lost {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// Panics with `e`, naming the line of the builder call that set the invalid value.
    #[track_caller]
    pub(crate) fn invalid(&self, layer: &str, e: ConfigError) -> ! {
        match self.noted_at(&e) {
            Some(at) => panic!("tollgate: invalid {layer}: {e} (set at {at})"),
            None => panic!("tollgate: invalid {layer}: {e}"),
        }
    }

    /// What a layer's services share of these settings.
    pub(crate) fn core(&self) -> Result<Core<E>, ConfigError>
    where
        E: Clone,
    {
        self.check()?;
        Ok(Core {
            extractor: self.extractor.clone(),
            on_missing: self.on_missing.clone(),
            on_reject: self.on_reject.clone(),
            allow: self.allow.clone(),
            misconfigured_logged: AtomicBool::new(false),
            keyless: AtomicU32::new(0),
            observe: self.observe,
        })
    }
}

/// The shared settings as a layer's services use them.
pub(crate) struct Core<E: KeyExtractor> {
    extractor: E,
    on_missing: MissingKey<E::Key>,
    on_reject: Option<OnReject>,
    allow: AllowList<E::Key>,
    /// Whether a key error that is the server's fault has been logged by this layer.
    misconfigured_logged: AtomicBool,
    /// Requests without a key while no request has had one; [`KEY_FOUND`] once one has.
    keyless: AtomicU32,
    /// Dry-run mode and key tracing.
    pub(crate) observe: Observe,
}

/// [`Core::keyless`] once a request has had a key.
const KEY_FOUND: u32 = u32::MAX;

/// Requests in a row without a key, with none ever found, after which a layer logs that its
/// extractor probably reads the wrong thing (a misspelt header name).
pub(crate) const KEYLESS_BEFORE_ERROR: u32 = 100;

impl<E: KeyExtractor> Core<E> {
    /// The request's key, or what the missing-key policy says when it has none; `Pass` for a
    /// request the allow list lets through (its client address is checked first, then its
    /// key).
    ///
    /// A key error that is the server's fault ([`KeyError::is_misconfigured`], e.g. `PeerIp`
    /// served without ConnectInfo) is logged as an error the first time this layer meets it;
    /// so is a layer whose first [`KEYLESS_BEFORE_ERROR`] requests all had no key (a header
    /// name misspelt). The request still gets what the policy says.
    #[inline]
    pub(crate) fn resolve(&self, head: &RequestHead<'_>) -> Resolved<E::Key> {
        if self.allows_address(head) {
            return Resolved::Pass;
        }
        match self.extractor.extract(head) {
            Ok(key) => {
                if self.keyless.load(Ordering::Relaxed) != KEY_FOUND {
                    self.keyless.store(KEY_FOUND, Ordering::Relaxed);
                }
                match self.allow.allows_key(&key) {
                    true => Resolved::Pass,
                    false => Resolved::Key(key),
                }
            }
            Err(e) => {
                match e.is_misconfigured() {
                    true => self.misconfigured(
                        &e,
                        format_args!(
                            "no request can have a key, so every request gets the missing-key \
                             answer; {}",
                            e.reason()
                        ),
                    ),
                    false => self.keyless(&e),
                }
                self.on_missing.apply()
            }
        }
    }

    /// Whether the allow list lets the request's client address through, for a layer that
    /// needs no key (a global concurrency limit).
    #[inline]
    pub(crate) fn allows_address(&self, head: &RequestHead<'_>) -> bool {
        self.allow.has_ips() && self.allow.allows_ip(&self.extractor, head)
    }

    /// Logs a server set up so that requests have no key, saying what to fix: once per
    /// layer.
    #[cold]
    #[inline(never)]
    fn misconfigured(&self, e: &KeyError, what: std::fmt::Arguments<'_>) {
        if !self.misconfigured_logged.swap(true, Ordering::Relaxed) {
            tracing::error!(
                reason = e.reason(),
                "tollgate: {what} (logged once per layer)"
            );
        }
    }

    /// Counts a request without a key while none has had one: at the
    /// [`KEYLESS_BEFORE_ERROR`]th, the extractor is taken to read the wrong thing and logged
    /// as a misconfiguration, naming what it reads.
    #[cold]
    #[inline(never)]
    fn keyless(&self, e: &KeyError) {
        // Stops at the bound, and at `KEY_FOUND` once a key has been found.
        let counted = self
            .keyless
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                if n < KEYLESS_BEFORE_ERROR {
                    Some(n + 1)
                } else {
                    None
                }
            });
        if counted == Ok(KEYLESS_BEFORE_ERROR - 1) {
            let answer = match &self.on_missing {
                MissingKey::Reject(status) => format!("was answered {}", status.as_u16()),
                MissingKey::UseKey(_) => "was counted under the one missing-key key".to_owned(),
                MissingKey::Allow => "went through unlimited (MissingKey::Allow)".to_owned(),
            };
            self.misconfigured(
                e,
                format_args!(
                    "not one of the first {KEYLESS_BEFORE_ERROR} requests had a key ({}), and \
                     each {answer}: check that the key is read from what clients send (the \
                     layer keys by {}; a header name spelt as they spell it)",
                    e.reason(),
                    self.extractor
                        .describe()
                        .unwrap_or_else(|| std::any::type_name::<E>().to_owned()),
                ),
            );
        }
    }

    /// The key as rejection events show it: only when the layer traces keys.
    #[inline]
    pub(crate) fn traced<'k>(&self, key: &'k E::Key) -> Option<&'k dyn std::fmt::Debug> {
        self.observe
            .trace_keys
            .then_some(key as &dyn std::fmt::Debug)
    }

    /// The status a request without a key is turned away with, when the policy rejects.
    pub(crate) fn missing_status(&self) -> StatusCode {
        match self.on_missing {
            MissingKey::Reject(status) => status,
            _ => StatusCode::BAD_REQUEST,
        }
    }

    /// The rejection path of this layer ([`Refuser`]), counting under `names` in `meter`.
    #[inline]
    pub(crate) fn refuser<'a>(&'a self, names: &'a Names, meter: &'a DecisionMeter) -> Refuser<'a> {
        Refuser {
            names,
            meter,
            observe: self.observe,
            hook: self.on_reject.as_ref(),
        }
    }
}

/// The state a layer builds once, when it is first applied (or validated), shared by every
/// service it makes and by its clones. A builder call made before that starts a fresh one.
pub(crate) struct Lazy<T>(Arc<OnceLock<Result<Arc<T>, ConfigError>>>);

impl<T> Default for Lazy<T> {
    fn default() -> Self {
        Lazy(Arc::default())
    }
}

impl<T> Clone for Lazy<T> {
    fn clone(&self) -> Self {
        Lazy(self.0.clone())
    }
}

impl<T> Lazy<T> {
    /// The state, built by `build` the first time.
    pub(crate) fn get_or_build(
        &self,
        build: impl FnOnce() -> Result<T, ConfigError>,
    ) -> Result<Arc<T>, ConfigError> {
        self.0.get_or_init(|| build().map(Arc::new)).clone()
    }

    /// The state, if it has been built without error.
    pub(crate) fn get(&self) -> Option<&Arc<T>> {
        self.0.get().and_then(|r| r.as_ref().ok())
    }
}

/// The service shell of a layer: the inner service and the layer's shared state, `Clone`,
/// `Debug`, and tower's `get_ref` / `get_mut` / `into_inner`. Given the struct (its docs,
/// `pub struct`, its parameters with their defaults), it writes the struct too.
macro_rules! service_shell {
    (
        $(#[$doc:meta])*
        pub struct $name:ident <S $(, $p:ident : $bound:path $(= $default:ty)?)*> => $shared:ty
    ) => {
        $(#[$doc])*
        pub struct $name<S $(, $p: $bound $(= $default)?)*> {
            inner: S,
            shared: std::sync::Arc<$shared>,
        }

        $crate::layer::common::service_shell!($name<S $(, $p: $bound)*> => $shared);
    };
    ($name:ident <S $(, $p:ident : $bound:path)*> => $shared:ty) => {
        impl<S: Clone $(, $p: $bound)*> Clone for $name<S $(, $p)*> {
            fn clone(&self) -> Self {
                $name {
                    inner: self.inner.clone(),
                    shared: self.shared.clone(),
                }
            }
        }

        impl<S: std::fmt::Debug $(, $p: $bound)*> std::fmt::Debug for $name<S $(, $p)*> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($name))
                    .field("inner", &self.inner)
                    .finish_non_exhaustive()
            }
        }

        impl<S $(, $p: $bound)*> $name<S $(, $p)*> {
            pub(crate) fn from_shared(inner: S, shared: std::sync::Arc<$shared>) -> Self {
                $name { inner, shared }
            }
        }

        $crate::layer::common::inner_access!($name<S $(, $p: $bound)*>);
    };
}

pub(crate) use service_shell;

/// tower's `get_ref` / `get_mut` / `into_inner` for a service whose wrapped service is its
/// `inner` field.
macro_rules! inner_access {
    ($name:ident <S $(, $p:ident $(: $bound:path)?)*>) => {
        impl<S $(, $p $(: $bound)?)*> $name<S $(, $p)*> {
            /// The wrapped service.
            pub fn get_ref(&self) -> &S {
                &self.inner
            }

            /// The wrapped service, mutably.
            pub fn get_mut(&mut self) -> &mut S {
                &mut self.inner
            }

            /// Unwraps the inner service.
            pub fn into_inner(self) -> S {
                self.inner
            }
        }
    };
}

pub(crate) use inner_access;

/// The builder settings every layer has, written once over the layer's `common` and `state`
/// fields: each layer gives the docs, in its own words, and the names to generate
/// (`changed`, private, starts the layer's state afresh after a setting changed).
macro_rules! common_setters {
    ($($(#[$doc:meta])* fn $setter:ident;)+) => {
        $(common_setters!(@one [$(#[$doc])*] $setter);)+
    };
    (@one [$(#[$doc:meta])*] changed) => {
        $(#[$doc])*
        fn changed(mut self) -> Self {
            // A setting changed before the layer was used: start from a fresh state.
            self.state = $crate::layer::common::Lazy::default();
            self
        }
    };
    (@one [$(#[$doc:meta])*] on_missing_key) => {
        $(#[$doc])*
        #[track_caller]
        pub fn on_missing_key(mut self, policy: $crate::key::MissingKey<E::Key>) -> Self {
            self.common.set_on_missing(policy);
            self.changed()
        }
    };
    (@one [$(#[$doc:meta])*] allow_ip) => {
        $(#[$doc])*
        #[track_caller]
        pub fn allow_ip(mut self, cidr: &str) -> Self {
            self.common.allow_ip(cidr);
            self.changed()
        }
    };
    (@one [$(#[$doc:meta])*] allow_key) => {
        $(#[$doc])*
        pub fn allow_key(mut self, key: E::Key) -> Self {
            self.common.allow_key(key);
            self.changed()
        }
    };
    (@one [$(#[$doc:meta])*] dry_run) => {
        $(#[$doc])*
        pub fn dry_run(mut self, on: bool) -> Self {
            self.common.observe.dry_run = on;
            self.changed()
        }
    };
    (@one [$(#[$doc:meta])*] trace_keys) => {
        $(#[$doc])*
        pub fn trace_keys(mut self, on: bool) -> Self {
            self.common.observe.trace_keys = on;
            self.changed()
        }
    };
    (@one [$(#[$doc:meta])*] on_reject) => {
        $(#[$doc])*
        pub fn on_reject(mut self, hook: $crate::response::OnReject) -> Self {
            self.common.on_reject = Some(hook);
            self.changed()
        }
    };
}

pub(crate) use common_setters;
