//! Key extractors: which bucket a request is counted in.
//!
//! One trait, [`KeyExtractor`], is shared by every layer of the crate. A key that cannot be
//! extracted (a missing header, no peer address) is an [`KeyError`], never a panic or a 500:
//! the layer's `on_missing_key` policy decides what happens to the request.
//!
//! | extractor | key | notes |
//! |---|---|---|
//! | [`Global`] | `()` | one bucket for everything |
//! | [`PeerIp`](struct@PeerIp) | [`IpKey`] | the TCP peer (axum `ConnectInfo`: serve with `into_make_service_with_connect_info::<SocketAddr>()`, else no request has a key); IPv6 grouped by /64 |
//! | [`ClientIp`] | [`IpKey`] | `X-Forwarded-For` / `Forwarded` / `X-Real-IP`, trusted only from configured proxies |
//! | [`Header`] | `Box<[u8]>` | a header's value, e.g. an API key |
//! | [`Route`] | `Arc<str>` | the matched route (axum `MatchedPath`), else the path |
//! | [`GrpcMethod`] | `Arc<str>` | a gRPC call's `/package.Service/Method` |
//! | [`Metadata`] | `Box<str>` | an ASCII gRPC metadata entry |
//! | [`from_fn`] | any | a closure over the request head |
//! | `(A, B)`, `(A, B, C)` | tuple | every part must be present |
//! | [`KeyExtractorExt::or`] | [`Either`] | the first extractor that succeeds, tagged with which one |

use std::fmt;
use std::hash::Hash;
use std::net::IpAddr;
use std::sync::Arc;

use http::{Extensions, HeaderMap, HeaderName, Method, Request, Uri};

mod bounded;
mod grpc;
mod ip;
pub(crate) mod missing;

pub use bounded::{bounded_bytes, bounded_str, MAX_KEY_BYTES};
pub use grpc::{GrpcMethod, Metadata};
pub(crate) use ip::{peer_addr, Cidr};
pub use ip::{ClientIp, ForwardedHeader, IpKey, PeerIp};
// At the crate root for users; here for the crate's own paths.
pub(crate) use missing::MissingKey;

/// The parts of a request that extractors, cost functions and tier selectors look at.
///
/// Borrowed from an `http::Request` of any body type, so one extractor serves every service.
#[derive(Debug, Clone, Copy)]
pub struct RequestHead<'a> {
    /// The request method.
    pub method: &'a Method,
    /// The request URI.
    pub uri: &'a Uri,
    /// The request headers.
    pub headers: &'a HeaderMap,
    /// The request extensions (axum's `ConnectInfo` and `MatchedPath` live here).
    pub extensions: &'a Extensions,
}

impl<'a> RequestHead<'a> {
    /// Borrows the head of `req`.
    pub fn new<B>(req: &'a Request<B>) -> Self {
        RequestHead {
            method: req.method(),
            uri: req.uri(),
            headers: req.headers(),
            extensions: req.extensions(),
        }
    }
}

/// Why a key could not be extracted from a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyError {
    reason: &'static str,
    /// The server, not the client, is at fault: no request can ever have a key.
    misconfigured: bool,
}

impl KeyError {
    /// A key error with a short reason, e.g. `"missing header x-api-key"`.
    pub const fn new(reason: &'static str) -> Self {
        KeyError {
            reason,
            misconfigured: false,
        }
    }

    /// A key error that no client can avoid because the server is set up wrongly (it was not
    /// served with the connection information the extractor reads): every layer logs it as
    /// an error, once, with `reason` naming the fix.
    pub const fn misconfigured(reason: &'static str) -> Self {
        KeyError {
            reason,
            misconfigured: true,
        }
    }

    /// Whether the server, not the request, is at fault (see [`misconfigured`](Self::misconfigured)).
    pub fn is_misconfigured(&self) -> bool {
        self.misconfigured
    }

    /// The reason.
    pub fn reason(&self) -> &'static str {
        self.reason
    }
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "no rate-limit key: {}", self.reason)
    }
}

impl std::error::Error for KeyError {}

/// Picks the key a request is counted under.
///
/// Keys come from clients, so they are hashed with a per-process random seed and the number of
/// tracked keys is bounded by the store.
pub trait KeyExtractor: Send + Sync + 'static {
    /// The key type.
    type Key: Clone + Eq + Hash + Send + Sync + fmt::Debug + 'static;

    /// Extracts the key of `req`.
    fn extract(&self, req: &RequestHead<'_>) -> Result<Self::Key, KeyError>;

    /// The client address this extractor resolves for `req`, full (not grouped) and in
    /// canonical form (IPv4-mapped IPv6 as IPv4), if it resolves one; `None` by default.
    ///
    /// A layer's allow list matches its IP ranges against this address, so that an address
    /// behind proxies is found exactly as the key is: [`ClientIp`] answers the address it
    /// trusts (never a header from an untrusted peer), [`PeerIp`](struct@PeerIp) the peer, tuples and
    /// [`KeyExtractorExt::or`] the first part that answers. When no part answers, the allow
    /// list uses the TCP peer address.
    fn client_ip(&self, req: &RequestHead<'_>) -> Option<IpAddr> {
        let _ = req;
        None
    }

    /// What this extractor keys by, stably: the same text in every process that runs the same
    /// configuration, and a different one for extractors whose keys mean different things
    /// (`header:x-api-key`, `peer-ip/64`, `(route,global)`). `None` (the default) when it
    /// cannot say: a closure ([`from_fn`], [`KeyExtractorExt::map`]) or an extractor of your
    /// own that does not override this.
    ///
    /// A layer whose limits live in Redis and whose policy is not named puts this text (with
    /// its quotas) into its Redis key names, so that two layers keyed differently never share
    /// a bucket there, just as they do not in memory. Without it, such a layer does not build
    /// ([`ConfigError::UnnamedRedisKeys`](crate::ConfigError::UnnamedRedisKeys)): name the
    /// policy or the extractor ([`KeyExtractorExt::named`]). It also names the extractor in
    /// the error a layer logs when none of its first requests had a key.
    fn describe(&self) -> Option<String> {
        None
    }
}

impl<E: KeyExtractor + ?Sized> KeyExtractor for Arc<E> {
    type Key = E::Key;
    fn extract(&self, req: &RequestHead<'_>) -> Result<Self::Key, KeyError> {
        (**self).extract(req)
    }
    fn client_ip(&self, req: &RequestHead<'_>) -> Option<IpAddr> {
        (**self).client_ip(req)
    }
    fn describe(&self) -> Option<String> {
        (**self).describe()
    }
}

/// Combinators on key extractors.
pub trait KeyExtractorExt: KeyExtractor + Sized {
    /// Uses `self`, or `other` when `self` finds no key.
    ///
    /// The key says which extractor found it ([`Either::First`] or [`Either::Second`]), so the
    /// two never share a bucket: a client cannot send another client's address as its API key
    /// and spend that client's limit. The two key types need not be the same.
    ///
    /// ```
    /// use tollgate::key::{Either, Header, KeyExtractorExt, PeerIp};
    /// // Requests with an API key are counted per key; the others per client address.
    /// let by_key_or_ip = Header::new("x-api-key").or(PeerIp::new());
    /// # let _ = by_key_or_ip;
    /// ```
    ///
    /// Mapping both sides to one type (`.map(|k| k.to_vec())` and
    /// `.map(|ip| ip.to_string().into_bytes())`) would not help: the tag is still there, so an
    /// API key that reads `198.51.100.7` stays apart from the client at 198.51.100.7.
    fn or<O: KeyExtractor>(self, other: O) -> Or<Self, O> {
        Or(self, other)
    }

    /// Keeps `self`'s key, but resolves the client address that allow lists match with
    /// `client` (see [`KeyExtractor::client_ip`]): for a key that is not an address, behind
    /// proxies.
    ///
    /// ```
    /// use tollgate::key::{ClientIp, Header, KeyExtractorExt};
    /// use tollgate::{Quota, RateLimitLayer};
    /// // Per username; the office is recognised behind our proxy, as `ClientIp` sees it.
    /// let per_user = RateLimitLayer::new(Quota::per_minute(20))
    ///     .key(Header::new("x-user").with_client_ip(ClientIp::new().trust_proxy("10.0.0.0/8")))
    ///     .allow_ip("203.0.113.0/24");
    /// # let _ = per_user;
    /// ```
    fn with_client_ip<C: KeyExtractor>(self, client: C) -> WithClientIp<Self, C> {
        WithClientIp(self, client)
    }

    /// Transforms the key.
    fn map<F, T>(self, f: F) -> Map<Self, F>
    where
        F: Fn(Self::Key) -> T + Send + Sync + 'static,
        T: Clone + Eq + Hash + Send + Sync + fmt::Debug + 'static,
    {
        Map(self, f)
    }

    /// The same extractor, described as `name` (see [`KeyExtractor::describe`]): for a
    /// closure or a mapped key whose limits live in Redis. Two extractors named alike share
    /// their buckets there (under policies with the same quotas), so give each meaning its
    /// own name.
    ///
    /// ```
    /// use tollgate::key::{self, KeyExtractor, KeyExtractorExt, RequestHead};
    /// let tenant = key::from_fn(|req: &RequestHead<'_>| {
    ///     req.uri.path().split('/').nth(1).map(str::to_owned)
    /// })
    /// .named("tenant");
    /// assert_eq!(tenant.describe().as_deref(), Some("named:tenant"));
    /// ```
    fn named(self, name: impl Into<String>) -> Named<Self> {
        Named(self, name.into())
    }
}

impl<E: KeyExtractor> KeyExtractorExt for E {}

/// An extractor with a name of its own. See [`KeyExtractorExt::named`].
#[derive(Debug, Clone)]
pub struct Named<E>(E, String);

impl<E: KeyExtractor> KeyExtractor for Named<E> {
    type Key = E::Key;
    fn extract(&self, req: &RequestHead<'_>) -> Result<E::Key, KeyError> {
        self.0.extract(req)
    }
    fn client_ip(&self, req: &RequestHead<'_>) -> Option<IpAddr> {
        self.0.client_ip(req)
    }
    /// `named:` and the name, with `\`, `(`, `)` and `,` escaped by a `\`: a name cannot
    /// end the part it is in, so `or` chains and tuples of named extractors describe alike
    /// only when their names are alike.
    fn describe(&self) -> Option<String> {
        let mut out = String::with_capacity(6 + self.1.len());
        out.push_str("named:");
        for c in self.1.chars() {
            if matches!(c, '\\' | '(' | ')' | ',') {
                out.push('\\');
            }
            out.push(c);
        }
        Some(out)
    }
}

/// The first of two extractors that finds a key. See [`KeyExtractorExt::or`].
#[derive(Debug, Clone)]
pub struct Or<A, B>(A, B);

impl<A: KeyExtractor, B: KeyExtractor> KeyExtractor for Or<A, B> {
    type Key = Either<A::Key, B::Key>;
    fn extract(&self, req: &RequestHead<'_>) -> Result<Self::Key, KeyError> {
        match self.0.extract(req) {
            Ok(k) => Ok(Either::First(k)),
            Err(_) => self.1.extract(req).map(Either::Second),
        }
    }
    fn client_ip(&self, req: &RequestHead<'_>) -> Option<IpAddr> {
        self.0.client_ip(req).or_else(|| self.1.client_ip(req))
    }
    fn describe(&self) -> Option<String> {
        Some(format!("or({},{})", self.0.describe()?, self.1.describe()?))
    }
}

/// The key of [`Or`]: which of the two extractors found it, and its key.
///
/// Keys of the two sides are never equal, even when their values are: `First(x)` and
/// `Second(x)` are counted in different buckets (and, in Redis, written as `1:<x>` and
/// `2:<x>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Either<A, B> {
    /// Found by the first extractor.
    First(A),
    /// Found by the second extractor, the first having found none.
    Second(B),
}

/// An extractor whose client address comes from another. See
/// [`KeyExtractorExt::with_client_ip`].
#[derive(Debug, Clone)]
pub struct WithClientIp<E, C>(E, C);

impl<E: KeyExtractor, C: KeyExtractor> KeyExtractor for WithClientIp<E, C> {
    type Key = E::Key;
    fn extract(&self, req: &RequestHead<'_>) -> Result<E::Key, KeyError> {
        self.0.extract(req)
    }
    fn client_ip(&self, req: &RequestHead<'_>) -> Option<IpAddr> {
        self.1.client_ip(req)
    }
    /// The key's extractor's: where allow lists look changes no key.
    fn describe(&self) -> Option<String> {
        self.0.describe()
    }
}

/// An extractor whose key is transformed. See [`KeyExtractorExt::map`].
#[derive(Clone)]
pub struct Map<E, F>(E, F);

impl<E: fmt::Debug, F> fmt::Debug for Map<E, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Map").field(&self.0).finish()
    }
}

impl<E, F, T> KeyExtractor for Map<E, F>
where
    E: KeyExtractor,
    F: Fn(E::Key) -> T + Send + Sync + 'static,
    T: Clone + Eq + Hash + Send + Sync + fmt::Debug + 'static,
{
    type Key = T;
    fn extract(&self, req: &RequestHead<'_>) -> Result<T, KeyError> {
        self.0.extract(req).map(&self.1)
    }
    fn client_ip(&self, req: &RequestHead<'_>) -> Option<IpAddr> {
        self.0.client_ip(req)
    }
}

/// One key for every request: a limit on the whole service (or route).
#[derive(Debug, Clone, Copy, Default)]
pub struct Global;

impl KeyExtractor for Global {
    type Key = ();
    #[inline]
    fn extract(&self, _: &RequestHead<'_>) -> Result<(), KeyError> {
        Ok(())
    }
    fn describe(&self) -> Option<String> {
        Some("global".to_owned())
    }
}

/// The value of a request header, e.g. an API key. Requests without it have no key.
///
/// The value is copied (the key must not keep the connection's read buffer alive); a value
/// longer than [`MAX_KEY_BYTES`] is kept as its digest (see [`bounded_bytes`]).
#[derive(Debug, Clone)]
pub struct Header {
    name: HeaderName,
}

impl Header {
    /// Keys requests by the header `name`.
    ///
    /// # Panics
    /// When `name` is not a valid header name; use [`Header::try_new`] for names read from
    /// configuration.
    #[track_caller]
    pub fn new(name: &str) -> Self {
        match Self::try_new(name) {
            Ok(h) => h,
            Err(e) => panic!("tollgate: {e}"),
        }
    }

    /// Keys requests by the header `name`, or returns
    /// [`ConfigError::InvalidHeaderName`](crate::ConfigError::InvalidHeaderName).
    pub fn try_new(name: &str) -> Result<Self, crate::ConfigError> {
        match HeaderName::try_from(name) {
            Ok(name) => Ok(Header { name }),
            Err(_) => Err(crate::ConfigError::InvalidHeaderName(name.to_owned())),
        }
    }

    /// Keys requests by the header `name`.
    pub fn from_name(name: HeaderName) -> Self {
        Header { name }
    }
}

impl KeyExtractor for Header {
    type Key = Box<[u8]>;
    fn extract(&self, req: &RequestHead<'_>) -> Result<Self::Key, KeyError> {
        match req.headers.get(&self.name) {
            // At most `MAX_KEY_BYTES` bytes, whatever the client sends.
            Some(v) if !v.is_empty() => Ok(bounded_bytes(v.as_bytes())),
            _ => Err(KeyError::new("missing header")),
        }
    }
    fn describe(&self) -> Option<String> {
        Some(format!("header:{}", self.name))
    }
}

/// The route the request matched (axum's `MatchedPath`, e.g. `/users/{id}`), or the request
/// path when no route was matched yet (kept as its digest when longer than [`MAX_KEY_BYTES`],
/// see [`bounded_str`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct Route;

impl KeyExtractor for Route {
    type Key = Arc<str>;
    fn extract(&self, req: &RequestHead<'_>) -> Result<Self::Key, KeyError> {
        #[cfg(feature = "axum")]
        if let Some(p) = req.extensions.get::<axum::extract::MatchedPath>() {
            return Ok(Arc::from(p.as_str()));
        }
        // The path of an unmatched request is the client's: at most 72 bytes are kept.
        Ok(bounded_str(req.uri.path()))
    }
    fn describe(&self) -> Option<String> {
        Some("route".to_owned())
    }
}

/// A key extractor made of a closure over the request head; `None` means "no key".
///
/// The key is kept as the closure returns it: build keys from client bytes with
/// [`bounded_bytes`] or [`bounded_str`] so that none costs more than [`MAX_KEY_BYTES`].
///
/// ```
/// use tollgate::key::{self, RequestHead};
/// // Count requests per tenant, taken from the first path segment.
/// let tenant = key::from_fn(|req: &RequestHead<'_>| {
///     req.uri.path().split('/').nth(1).filter(|s| !s.is_empty()).map(str::to_owned)
/// });
/// # let _ = tenant;
/// ```
pub fn from_fn<F, K>(f: F) -> FromFn<F>
where
    F: Fn(&RequestHead<'_>) -> Option<K> + Send + Sync + 'static,
    K: Clone + Eq + Hash + Send + Sync + fmt::Debug + 'static,
{
    FromFn(f)
}

/// A closure key extractor. See [`from_fn`].
#[derive(Clone)]
pub struct FromFn<F>(F);

impl<F> fmt::Debug for FromFn<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FromFn")
    }
}

impl<F, K> KeyExtractor for FromFn<F>
where
    F: Fn(&RequestHead<'_>) -> Option<K> + Send + Sync + 'static,
    K: Clone + Eq + Hash + Send + Sync + fmt::Debug + 'static,
{
    type Key = K;
    fn extract(&self, req: &RequestHead<'_>) -> Result<K, KeyError> {
        (self.0)(req).ok_or(KeyError::new("the key function returned None"))
    }
}

macro_rules! tuple_extractor {
    ($($name:ident $idx:tt),+) => {
        impl<$($name: KeyExtractor),+> KeyExtractor for ($($name,)+) {
            type Key = ($($name::Key,)+);
            fn extract(&self, req: &RequestHead<'_>) -> Result<Self::Key, KeyError> {
                Ok(($(self.$idx.extract(req)?,)+))
            }
            fn client_ip(&self, req: &RequestHead<'_>) -> Option<IpAddr> {
                None$(.or_else(|| self.$idx.client_ip(req)))+
            }
            fn describe(&self) -> Option<String> {
                let parts = [$(self.$idx.describe()?),+];
                Some(format!("({})", parts.join(",")))
            }
        }
    };
}

tuple_extractor!(A 0, B 1);
tuple_extractor!(A 0, B 1, C 2);
tuple_extractor!(A 0, B 1, C 2, D 3);

#[cfg(test)]
mod tests {
    use super::*;

    fn head_of<T>(req: &Request<T>) -> RequestHead<'_> {
        RequestHead::new(req)
    }

    #[test]
    fn header_key_is_the_value_and_missing_header_is_an_error() {
        let req = Request::builder()
            .header("x-api-key", "abc")
            .body(())
            .unwrap();
        let k = Header::new("x-api-key").extract(&head_of(&req)).unwrap();
        assert_eq!(&*k, b"abc");
        let req = Request::builder().body(()).unwrap();
        assert!(Header::new("x-api-key").extract(&head_of(&req)).is_err());
    }

    #[test]
    fn tuple_needs_every_part_and_or_falls_back() {
        let req = Request::builder()
            .uri("/a/b")
            .header("x-api-key", "abc")
            .body(())
            .unwrap();
        let pair = (Header::new("x-api-key"), Route);
        let (k, r) = pair.extract(&head_of(&req)).unwrap();
        assert_eq!((&*k, &*r), (&b"abc"[..], "/a/b"));
        let missing = (Header::new("x-other"), Route);
        assert!(missing.extract(&head_of(&req)).is_err());
        let either = Header::new("x-other").or(Header::new("x-api-key"));
        assert_eq!(
            either.extract(&head_of(&req)).unwrap(),
            Either::Second(b"abc"[..].into())
        );
        let first = Header::new("x-api-key").or(Header::new("x-other"));
        assert_eq!(
            first.extract(&head_of(&req)).unwrap(),
            Either::First(b"abc"[..].into())
        );
    }

    #[test]
    fn header_names_from_configuration_are_checked_without_panics() {
        assert!(Header::try_new("x-api-key").is_ok());
        assert_eq!(
            Header::try_new("x api key").err(),
            Some(crate::ConfigError::InvalidHeaderName("x api key".into()))
        );
    }

    #[cfg(feature = "redis")]
    #[test]
    fn either_sides_write_different_redis_keys() {
        use crate::redis::RedisKey;
        let bytes = |k: Either<&str, &str>| {
            let mut out = Vec::new();
            k.write_key(&mut out);
            out
        };
        assert_eq!(bytes(Either::First("1.2.3.4")), b"1:1.2.3.4");
        assert_eq!(bytes(Either::Second("1.2.3.4")), b"2:1.2.3.4");
    }

    #[test]
    fn closure_none_is_a_key_error() {
        let req = Request::builder().uri("/").body(()).unwrap();
        let f = from_fn(|r: &RequestHead<'_>| r.uri.path().strip_prefix("/t/").map(str::to_owned));
        assert!(f.extract(&head_of(&req)).is_err());
    }
}
