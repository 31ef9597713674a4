//! IP-address keys: the TCP peer ([`PeerIp`](struct@PeerIp)), and the client behind trusted proxies
//! ([`ClientIp`]).
//!
//! Threat model: every header is written by whoever opened the connection, so a client can
//! claim any address in `X-Forwarded-For`, `Forwarded` or `X-Real-IP` and get a fresh bucket
//! with every request. Only the TCP peer address cannot be forged, and only a proxy you run can
//! vouch for the address it received a connection from. So forwarding headers are believed only
//! when the peer is a configured trusted proxy, and only the entries appended by trusted proxies
//! (read from the right) are believed.
//!
//! ```
//! use std::net::{IpAddr, SocketAddr};
//! use tollgate::key::{ClientIp, KeyExtractor, RequestHead};
//!
//! let client_ip = ClientIp::new().trust_proxy("10.0.0.0/8");
//! let mut req = http::Request::builder()
//!     .header("x-forwarded-for", "1.1.1.1, 203.0.113.7")
//!     .body(())?;
//!
//! // Through our proxy at 10.0.0.2: the address it appended is the client.
//! req.extensions_mut().insert(SocketAddr::from(([10, 0, 0, 2], 41000)));
//! assert_eq!(client_ip.extract(&RequestHead::new(&req))?.ip(), IpAddr::from([203, 0, 113, 7]));
//!
//! // The same header straight from the internet is ignored: the key is the peer.
//! req.extensions_mut().insert(SocketAddr::from(([198, 51, 100, 9], 41000)));
//! assert_eq!(client_ip.extract(&RequestHead::new(&req))?.ip(), IpAddr::from([198, 51, 100, 9]));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use http::header::ValueIter;
use http::{HeaderMap, HeaderName, HeaderValue};

use super::{KeyError, KeyExtractor, RequestHead};
use crate::ConfigError;

/// The address of the TCP peer (axum's `ConnectInfo<SocketAddr>`, or a `SocketAddr` in the
/// request extensions).
///
/// IPv6 addresses are grouped by their /64 prefix by default (one host usually owns a whole
/// /64, so counting single addresses would let it rotate through 2^64 keys); see
/// [`ipv6_prefix`](PeerIp::ipv6_prefix). IPv4-mapped IPv6 addresses (`::ffff:a.b.c.d`, as seen
/// on dual-stack sockets) are keyed as the IPv4 address. A request without a peer address has
/// no key ([`KeyError`]).
///
/// **Serve with `ConnectInfo`.** axum puts the peer address in the request only when the app
/// is served with `into_make_service_with_connect_info::<SocketAddr>()`:
/// `axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>())`. Served
/// with a plain `axum::serve(listener, app)`, no request has a peer address, so every request
/// gets the layer's missing-key answer ([`MissingKey`](crate::MissingKey): `400 Bad Request`
/// by default) — a server bug, not a client one. With other servers, insert the peer's
/// `SocketAddr` into the request extensions.
///
/// Spelled like the unit extractors: `key::PeerIp` (a constant of this type, with the
/// defaults) is the same as `key::PeerIp::new()`, and `key::PeerIp.ipv6_prefix(48)` works too.
///
/// ```
/// use std::net::{IpAddr, SocketAddr};
/// use tollgate::key::{KeyExtractor, PeerIp, RequestHead};
///
/// let mut req = http::Request::new(());
/// req.extensions_mut().insert("[2001:db8:1:2:3:4:5:6]:443".parse::<SocketAddr>()?);
/// let head = RequestHead::new(&req);
/// assert_eq!(PeerIp::new().extract(&head)?.ip(), "2001:db8:1:2::".parse::<IpAddr>()?);
/// assert_eq!(PeerIp::new().ipv6_prefix(48).extract(&head)?.ip(), "2001:db8:1::".parse::<IpAddr>()?);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy)]
pub struct PeerIp {
    v6_prefix: u8,
}

/// [`PeerIp`](struct@PeerIp) with its defaults (IPv6 grouped by /64): `.key(key::PeerIp)`,
/// spelled like `key::Route` and `key::Global`. The same as `PeerIp::new()`.
#[allow(non_upper_case_globals)]
pub const PeerIp: PeerIp = PeerIp { v6_prefix: 64 };

impl Default for PeerIp {
    fn default() -> Self {
        PeerIp
    }
}

impl PeerIp {
    /// Keys requests by the peer address, IPv6 grouped by /64 (the same as the constant
    /// `key::PeerIp`).
    #[must_use]
    pub const fn new() -> Self {
        PeerIp
    }

    /// Groups IPv6 addresses by their first `bits` bits: `128` keys every address on its own,
    /// `48` keys a whole site, `0` puts all of IPv6 in one bucket. Values above 128 mean 128.
    /// IPv4 addresses are never grouped.
    #[must_use]
    pub fn ipv6_prefix(mut self, bits: u8) -> Self {
        self.v6_prefix = bits.min(128);
        self
    }
}

pub(crate) fn peer_addr(req: &RequestHead<'_>) -> Option<SocketAddr> {
    #[cfg(feature = "axum")]
    if let Some(ci) = req
        .extensions
        .get::<axum::extract::ConnectInfo<SocketAddr>>()
    {
        return Some(ci.0);
    }
    req.extensions.get::<SocketAddr>().copied()
}

/// The key of `ip`: IPv4-mapped IPv6 becomes IPv4, other IPv6 is cut to `v6_prefix` bits.
/// The key of the IP extractors: an address in 16 bytes (IPv4 stored IPv4-mapped), so that a
/// tracked key with its state takes 24 bytes instead of the 32 an `IpAddr` would need.
///
/// ```
/// use std::net::IpAddr;
/// use tollgate::key::IpKey;
/// let ip: IpAddr = "192.0.2.7".parse().unwrap();
/// let key = IpKey::from(ip);
/// assert_eq!(key.ip(), ip);
/// assert_eq!(key.to_string(), "192.0.2.7");
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IpKey([u8; 16]);

impl IpKey {
    /// The address (IPv4 addresses come back as IPv4).
    pub fn ip(&self) -> IpAddr {
        Ipv6Addr::from(self.0).to_canonical()
    }

    /// The 16 bytes of the address as IPv6 (IPv4 as `::ffff:a.b.c.d`).
    pub fn octets(&self) -> [u8; 16] {
        self.0
    }
}

impl From<IpAddr> for IpKey {
    fn from(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(v4) => IpKey(v4.to_ipv6_mapped().octets()),
            IpAddr::V6(v6) => IpKey(v6.octets()),
        }
    }
}

impl From<IpKey> for IpAddr {
    fn from(key: IpKey) -> Self {
        key.ip()
    }
}

impl std::fmt::Debug for IpKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&self.ip(), f)
    }
}

impl std::fmt::Display for IpKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.ip(), f)
    }
}

fn group(ip: IpAddr, v6_prefix: u8) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & mask128(v6_prefix))),
    }
}

/// The netmask of an IPv4 prefix of `len` bits (`len` above 32 means 32).
fn mask32(len: u8) -> u32 {
    match len {
        0 => 0,
        l => u32::MAX << (32 - u32::from(l.min(32))),
    }
}

/// The netmask of an IPv6 prefix of `len` bits (`len` above 128 means 128).
fn mask128(len: u8) -> u128 {
    match len {
        0 => 0,
        l => u128::MAX << (128 - u32::from(l.min(128))),
    }
}

impl KeyExtractor for PeerIp {
    type Key = IpKey;
    fn extract(&self, req: &RequestHead<'_>) -> Result<IpKey, KeyError> {
        peer_addr(req)
            .map(|a| IpKey::from(group(a.ip(), self.v6_prefix)))
            .ok_or(MISSING_PEER)
    }
}

const MISSING_PEER: KeyError = KeyError::new("no peer address (serve with ConnectInfo)");

/// A range of addresses, `a.b.c.d/n` or `x:x::x/n`; a bare address is a range of one.
///
/// Host bits below the prefix are ignored (`10.1.2.3/8` is `10.0.0.0/8`). An IPv4-mapped IPv6
/// range of at least /96 is stored as the IPv4 range it maps, because addresses are compared
/// in their canonical form (IPv4-mapped IPv6 as IPv4).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Cidr {
    /// The network address, host bits cleared.
    net: IpAddr,
    /// The prefix length, at most 32 for IPv4 and 128 for IPv6.
    len: u8,
}

impl Cidr {
    /// Parses `a.b.c.d`, `a.b.c.d/n` (n ≤ 32), `x:x::x`, `x:x::x/n` (n ≤ 128) or `[x:x::x]`,
    /// surrounding whitespace allowed. `None` for anything else.
    pub(crate) fn parse(s: &str) -> Option<Cidr> {
        let s = s.trim();
        let (addr, len) = match s.split_once('/') {
            Some((addr, len)) => (addr, Some(len)),
            None => (s, None),
        };
        let addr = addr
            .strip_prefix('[')
            .and_then(|a| a.strip_suffix(']'))
            .map_or_else(
                || addr.parse::<IpAddr>().ok(),
                |a| a.parse::<Ipv6Addr>().ok().map(IpAddr::V6),
            )?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let len = match len {
            None => max,
            // Digits only: `u8::from_str` would also take "+8".
            Some(l) if !l.is_empty() && l.len() <= 3 && l.bytes().all(|b| b.is_ascii_digit()) => {
                l.parse::<u8>().ok().filter(|&l| l <= max)?
            }
            Some(_) => return None,
        };
        Some(Cidr::new(addr, len))
    }

    fn new(addr: IpAddr, len: u8) -> Cidr {
        match addr {
            IpAddr::V4(v4) => Cidr {
                net: IpAddr::V4(Ipv4Addr::from(u32::from(v4) & mask32(len))),
                len,
            },
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) if len >= 96 => Cidr::new(IpAddr::V4(v4), len - 96),
                _ => Cidr {
                    net: IpAddr::V6(Ipv6Addr::from(u128::from(v6) & mask128(len))),
                    len,
                },
            },
        }
    }

    /// Whether `ip` (in canonical form: IPv4-mapped IPv6 as IPv4) is in the range.
    pub(crate) fn contains(&self, ip: IpAddr) -> bool {
        match (self.net, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => u32::from(ip) & mask32(self.len) == u32::from(net),
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                u128::from(ip) & mask128(self.len) == u128::from(net)
            }
            _ => false,
        }
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.net, self.len)
    }
}

impl fmt::Debug for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// A header that carries the chain of addresses a request was forwarded through.
/// See [`ClientIp::header`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ForwardedHeader {
    /// `X-Forwarded-For: client, proxy1, proxy2`: each proxy appends the address it received
    /// the request from. Several header lines are read as one list, in order. Entries may carry
    /// a port (`192.0.2.1:5678`, `[2001:db8::1]:80`).
    XForwardedFor,
    /// `Forwarded: for=192.0.2.60;proto=http, for="[2001:db8::1]:4711"` (RFC 7239): the `for=`
    /// parameter of each element. `for=unknown` and obfuscated identifiers (`for=_hidden`) are
    /// not addresses.
    Forwarded,
    /// `X-Real-IP: 192.0.2.60`: one address, set (replaced, not appended) by the nearest proxy.
    /// Several header lines, or a list, are not a single address and are ignored.
    XRealIp,
}

static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
static X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");

impl ForwardedHeader {
    fn name(self) -> &'static HeaderName {
        match self {
            ForwardedHeader::XForwardedFor => &X_FORWARDED_FOR,
            ForwardedHeader::Forwarded => &http::header::FORWARDED,
            ForwardedHeader::XRealIp => &X_REAL_IP,
        }
    }
}

/// The most list elements of a forwarding chain that [`ClientIp`] looks at, counted from the
/// right (empty elements included).
const MAX_HOPS: usize = 32;

/// The client address behind trusted reverse proxies.
///
/// A client can write anything into `X-Forwarded-For`; only the proxies you run can vouch for
/// the address *they* received a connection from. So the forwarding headers are read only
/// when the TCP peer is a trusted proxy, and the chain is read from the right (what your
/// proxies appended) to the first address that is not a trusted proxy: that is the client.
///
/// # Rules
///
/// - **No trusted proxies** ([`ClientIp::new`] alone): the key is the peer address, exactly
///   as with [`PeerIp`](struct@PeerIp).
/// - **Peer not trusted**: the headers are ignored entirely; the key is the peer address.
///   Sending forged headers directly changes nothing.
/// - **Peer trusted**: the first header of the [configured list](ClientIp::headers)
///   (default: `X-Forwarded-For`, then `Forwarded`) that the request carries is read; the
///   others are ignored, even when the first yields no address. Its addresses are walked from
///   the right, skipping trusted proxies; the first untrusted address is the client.
///   - Every address trusted: the left-most one is the client.
///   - An entry that is not an address (garbage, `unknown`, `_hidden`, a `Forwarded` element
///     without `for=`) stops the walk: the key is the last address seen to its right (the
///     view of the nearest trusted hop, possibly the peer itself). Nothing to its left is
///     guessed at.
///   - At most 32 list elements are looked at; a longer chain of trusted proxies ends the
///     walk at the 32nd, as if it were the client.
///   - No configured header present: the key is the peer address.
/// - The key is grouped as with [`PeerIp`](struct@PeerIp): IPv4-mapped IPv6 as IPv4, IPv6 by /64 unless set
///   with [`ipv6_prefix`](ClientIp::ipv6_prefix). Trust is decided on full addresses.
/// - No peer address at all: [`KeyError`].
///
/// Consult only a header your proxies set or overwrite. If your proxy sets only `Forwarded`
/// and passes a client's own `X-Forwarded-For` through, the default list reads the client's
/// version: configure [`header`](ClientIp::header) to match the proxy.
///
/// ```
/// use std::net::{IpAddr, SocketAddr};
/// use tollgate::key::{ClientIp, KeyExtractor, RequestHead};
///
/// let client_ip = ClientIp::new().trust_proxy("10.0.0.0/8").trust_proxy("fd00::/8");
///
/// // Our load balancer (10.0.0.2) forwarded a request that our edge proxy (10.0.0.3)
/// // received from 203.0.113.7; the client itself claimed to be 6.6.6.6.
/// let mut req = http::Request::builder()
///     .header("x-forwarded-for", "6.6.6.6, 203.0.113.7, 10.0.0.3")
///     .body(())?;
/// req.extensions_mut().insert(SocketAddr::from(([10, 0, 0, 2], 41000)));
/// let key = client_ip.extract(&RequestHead::new(&req))?;
/// assert_eq!(key.ip(), IpAddr::from([203, 0, 113, 7]));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct ClientIp {
    peer: PeerIp,
    trusted: Vec<Cidr>,
    headers: Vec<ForwardedHeader>,
}

impl Default for ClientIp {
    fn default() -> Self {
        ClientIp {
            peer: PeerIp::default(),
            trusted: Vec::new(),
            headers: vec![ForwardedHeader::XForwardedFor, ForwardedHeader::Forwarded],
        }
    }
}

impl ClientIp {
    /// Trusts no proxy (the key is the peer address, as with [`PeerIp`](struct@PeerIp)) until proxies are
    /// added with [`trust_proxy`](ClientIp::trust_proxy) and friends. Reads `X-Forwarded-For`,
    /// then `Forwarded`; IPv6 grouped by /64.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Trusts the proxies in `proxy`: an address (`"10.0.0.1"`, `"::1"`) or a CIDR range
    /// (`"10.0.0.0/8"`, `"fd00::/8"`). Host bits below the prefix are ignored.
    ///
    /// # Panics
    /// When `proxy` is neither. Use [`try_trust_proxy`](ClientIp::try_trust_proxy) for values
    /// read from configuration.
    #[track_caller]
    #[must_use]
    pub fn trust_proxy(self, proxy: &str) -> Self {
        match self.try_trust_proxy(proxy) {
            Ok(this) => this,
            Err(e) => panic!("tollgate: {e}"),
        }
    }

    /// Trusts the proxies in `proxy`, like [`trust_proxy`](ClientIp::trust_proxy).
    ///
    /// # Errors
    /// [`ConfigError::InvalidProxy`] when `proxy` is not an address or CIDR range.
    pub fn try_trust_proxy(mut self, proxy: &str) -> Result<Self, ConfigError> {
        let cidr = Cidr::parse(proxy).ok_or_else(|| ConfigError::InvalidProxy(proxy.to_owned()))?;
        self.add(cidr);
        Ok(self)
    }

    /// Trusts every entry of `proxies` (see [`trust_proxy`](ClientIp::trust_proxy)).
    ///
    /// # Panics
    /// When an entry is not an address or CIDR range.
    #[track_caller]
    #[must_use]
    pub fn trust_proxies<I>(self, proxies: I) -> Self
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        match self.try_trust_proxies(proxies) {
            Ok(this) => this,
            Err(e) => panic!("tollgate: {e}"),
        }
    }

    /// Trusts every entry of `proxies`, e.g. a list read from configuration.
    ///
    /// # Errors
    /// [`ConfigError::InvalidProxy`] naming the first entry that is not an address or CIDR
    /// range.
    pub fn try_trust_proxies<I>(self, proxies: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        proxies
            .into_iter()
            .try_fold(self, |this, p| this.try_trust_proxy(p.as_ref()))
    }

    /// Trusts loopback peers: `127.0.0.0/8` and `::1` (a proxy on the same host).
    #[must_use]
    pub fn trust_loopback(mut self) -> Self {
        self.add(Cidr::new(Ipv4Addr::new(127, 0, 0, 0).into(), 8));
        self.add(Cidr::new(Ipv6Addr::LOCALHOST.into(), 128));
        self
    }

    /// Trusts private and loopback addresses: `10.0.0.0/8`, `172.16.0.0/12`,
    /// `192.168.0.0/16` (RFC 1918), `fc00::/7` (unique local) and loopback.
    ///
    /// Only right when every host on those networks is yours: anyone who can connect from
    /// one of them chooses their own key.
    #[must_use]
    pub fn trust_private(mut self) -> Self {
        self.add(Cidr::new(Ipv4Addr::new(10, 0, 0, 0).into(), 8));
        self.add(Cidr::new(Ipv4Addr::new(172, 16, 0, 0).into(), 12));
        self.add(Cidr::new(Ipv4Addr::new(192, 168, 0, 0).into(), 16));
        self.add(Cidr::new(
            Ipv6Addr::new(0xfc00, 0, 0, 0, 0, 0, 0, 0).into(),
            7,
        ));
        self.trust_loopback()
    }

    /// Groups IPv6 client addresses by their first `bits` bits (default 64); values above
    /// 128 mean 128. See [`PeerIp::ipv6_prefix`].
    #[must_use]
    pub fn ipv6_prefix(mut self, bits: u8) -> Self {
        self.peer = self.peer.ipv6_prefix(bits);
        self
    }

    /// Reads only `header` (replacing the default list, or an earlier choice).
    #[must_use]
    pub fn header(self, header: ForwardedHeader) -> Self {
        self.headers([header])
    }

    /// Reads the first of `headers`, in order, that the request carries; the others are
    /// ignored even when that one yields no address. Repeated entries count once. An empty
    /// list reads no header: the key is the peer address.
    #[must_use]
    pub fn headers<I: IntoIterator<Item = ForwardedHeader>>(mut self, headers: I) -> Self {
        self.headers.clear();
        for h in headers {
            if !self.headers.contains(&h) {
                self.headers.push(h);
            }
        }
        self
    }

    fn add(&mut self, cidr: Cidr) {
        if !self.trusted.contains(&cidr) {
            self.trusted.push(cidr);
        }
    }

    /// Whether `ip` (canonical form) is a trusted proxy.
    fn is_trusted(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|c| c.contains(ip))
    }

    /// The client address (not grouped) of a request from `peer` (canonical form).
    fn client(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        if !self.is_trusted(peer) {
            return peer;
        }
        let Some(&which) = self.headers.iter().find(|h| headers.contains_key(h.name())) else {
            return peer;
        };
        let lines = headers.get_all(which.name()).iter();
        match which {
            ForwardedHeader::XForwardedFor => self.walk(
                peer,
                lines
                    .rev()
                    .flat_map(|v| v.as_bytes().rsplit(|&b| b == b','))
                    .map(xff_hop),
            ),
            ForwardedHeader::Forwarded => self.walk(
                peer,
                lines
                    .rev()
                    .flat_map(|v| RevElements(Some(v.as_bytes())))
                    .map(forwarded_hop),
            ),
            ForwardedHeader::XRealIp => real_ip(lines).unwrap_or(peer),
        }
    }

    /// Walks `hops`, right to left, from `peer` (trusted) to the first untrusted address.
    fn walk(&self, peer: IpAddr, hops: impl Iterator<Item = Hop>) -> IpAddr {
        let mut nearest = peer;
        for hop in hops.take(MAX_HOPS) {
            match hop {
                Hop::Empty => {}
                Hop::Malformed => return nearest,
                Hop::Addr(ip) => {
                    let ip = ip.to_canonical();
                    if !self.is_trusted(ip) {
                        return ip;
                    }
                    nearest = ip;
                }
            }
        }
        nearest
    }
}

impl KeyExtractor for ClientIp {
    type Key = IpKey;
    fn extract(&self, req: &RequestHead<'_>) -> Result<IpKey, KeyError> {
        let peer = peer_addr(req).ok_or(MISSING_PEER)?.ip().to_canonical();
        Ok(IpKey::from(group(
            self.client(peer, req.headers),
            self.peer.v6_prefix,
        )))
    }
}

/// One element of a forwarding chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hop {
    /// An empty list element (`a,,b`): ignored, as RFC 9110 asks.
    Empty,
    /// An address.
    Addr(IpAddr),
    /// Anything else: the walk stops.
    Malformed,
}

/// The address of an `X-Real-IP` header: one line holding one entry, else `None`.
fn real_ip(mut lines: ValueIter<'_, HeaderValue>) -> Option<IpAddr> {
    let (Some(line), None) = (lines.next(), lines.next()) else {
        return None;
    };
    let line = line.as_bytes();
    if line.contains(&b',') {
        return None;
    }
    parse_node(line).map(|ip| ip.to_canonical())
}

/// The longest node (address and port) accepted: `[` 45-character IPv6 `]:65535` fits.
const MAX_NODE_LEN: usize = 64;

/// An `X-Forwarded-For` entry.
fn xff_hop(entry: &[u8]) -> Hop {
    let entry = entry.trim_ascii();
    if entry.is_empty() {
        return Hop::Empty;
    }
    parse_node(entry).map_or(Hop::Malformed, Hop::Addr)
}

/// `192.0.2.1`, `192.0.2.1:80`, `2001:db8::1`, `[2001:db8::1]`, `[2001:db8::1]:80`; the port
/// may be an RFC 7239 obfuscated port (`_p1`).
fn parse_node(node: &[u8]) -> Option<IpAddr> {
    let node = node.trim_ascii();
    if node.len() > MAX_NODE_LEN {
        return None;
    }
    let node = std::str::from_utf8(node).ok()?;
    if let Some(rest) = node.strip_prefix('[') {
        let (addr, port) = rest.split_once(']')?;
        let ip = addr.parse::<Ipv6Addr>().ok()?;
        let port_ok = port.is_empty() || port.strip_prefix(':').is_some_and(valid_port);
        return port_ok.then_some(IpAddr::V6(ip));
    }
    if let Ok(ip) = node.parse::<IpAddr>() {
        return Some(ip);
    }
    let (addr, port) = node.split_once(':')?;
    let ip = addr.parse::<Ipv4Addr>().ok()?;
    valid_port(port).then_some(IpAddr::V4(ip))
}

/// A port number, or an RFC 7239 obfuscated port (`_` then `[A-Za-z0-9._-]`).
fn valid_port(port: &str) -> bool {
    match port.strip_prefix('_') {
        Some(obf) => {
            !obf.is_empty()
                && obf
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        }
        None => {
            !port.is_empty()
                && port.len() <= 5
                && port.bytes().all(|b| b.is_ascii_digit())
                && port.parse::<u16>().is_ok()
        }
    }
}

/// The comma-separated elements of a `Forwarded` line, right to left, commas inside quoted
/// strings not counted. Linear in the length of the line.
///
/// Read from the right, a closing quote is met first; the opening one is the next quote not
/// escaped by an odd run of backslashes. Proxies write the right end, so it is well formed
/// whatever a client wrote to the left; an unbalanced quote makes the rest one element, which
/// then fails to parse.
struct RevElements<'a>(Option<&'a [u8]>);

impl<'a> Iterator for RevElements<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        let line = self.0?;
        let mut in_quotes = false;
        for (i, &b) in line.iter().enumerate().rev() {
            match b {
                b'"' if !in_quotes => in_quotes = true,
                b'"' => {
                    let before = line.get(..i).unwrap_or_default();
                    let escapes = before.iter().rev().take_while(|&&c| c == b'\\').count();
                    if escapes % 2 == 0 {
                        in_quotes = false;
                    }
                }
                b',' if !in_quotes => {
                    self.0 = line.get(..i);
                    return line.get(i + 1..);
                }
                _ => {}
            }
        }
        self.0 = None;
        Some(line)
    }
}

/// An RFC 7239 token character.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// One `Forwarded` element: `for=...;proto=...;by=...`. Its `for=` node is the hop; an element
/// without exactly one `for=`, or that does not parse, is malformed.
fn forwarded_hop(element: &[u8]) -> Hop {
    let element = element.trim_ascii();
    if element.is_empty() {
        return Hop::Empty;
    }
    let mut node: Option<Option<IpAddr>> = None;
    let mut rest = element;
    loop {
        rest = rest.trim_ascii_start();
        let name_len = rest.iter().take_while(|&&b| is_tchar(b)).count();
        let (name, after) = rest.split_at(name_len);
        if name.is_empty() {
            // The grammar allows empty pairs: "for=a;;proto=b", a trailing ";".
            match after.split_first() {
                None => break,
                Some((b';', after)) => {
                    rest = after;
                    continue;
                }
                Some(_) => return Hop::Malformed,
            }
        }
        let Some((b'=', after)) = after.trim_ascii_start().split_first() else {
            return Hop::Malformed;
        };
        let after = after.trim_ascii_start();
        let (value, after) = if let Some((b'"', quoted)) = after.split_first() {
            let Some(unquoted) = unquote(quoted) else {
                return Hop::Malformed;
            };
            unquoted
        } else {
            // A token; anything up to the next ';' is taken, and rejected if not a node.
            let len = after.iter().position(|&b| b == b';').unwrap_or(after.len());
            let (v, a) = after.split_at(len);
            (Value::of(v), a)
        };
        if name.eq_ignore_ascii_case(b"for") {
            if node.is_some() {
                return Hop::Malformed;
            }
            node = Some(value.as_bytes().and_then(parse_node));
        }
        match after.trim_ascii_start().split_first() {
            None => break,
            Some((b';', after)) => rest = after,
            Some(_) => return Hop::Malformed,
        }
    }
    match node {
        Some(Some(ip)) => Hop::Addr(ip),
        _ => Hop::Malformed,
    }
}

/// A parameter value, kept only as long as a node can be (longer values are never
/// addresses), without allocating.
struct Value {
    buf: [u8; MAX_NODE_LEN],
    len: usize,
    too_long: bool,
}

impl Value {
    fn new() -> Self {
        Value {
            buf: [0; MAX_NODE_LEN],
            len: 0,
            too_long: false,
        }
    }

    fn of(bytes: &[u8]) -> Self {
        let mut v = Value::new();
        for &b in bytes {
            v.push(b);
        }
        v
    }

    fn push(&mut self, b: u8) {
        match self.buf.get_mut(self.len) {
            Some(slot) => {
                *slot = b;
                self.len += 1;
            }
            None => self.too_long = true,
        }
    }

    fn as_bytes(&self) -> Option<&[u8]> {
        if self.too_long {
            None
        } else {
            self.buf.get(..self.len)
        }
    }
}

/// The rest of a quoted string whose opening quote was consumed: its unescaped value and what
/// follows the closing quote. `None` when it is not closed.
fn unquote(s: &[u8]) -> Option<(Value, &[u8])> {
    let mut value = Value::new();
    let mut bytes = s.iter().enumerate();
    while let Some((i, &b)) = bytes.next() {
        match b {
            b'"' => return Some((value, s.get(i + 1..).unwrap_or_default())),
            b'\\' => value.push(*bytes.next()?.1),
            _ => value.push(b),
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderValue, Request};

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// A request from `peer` (port 4000) with `headers`, values as raw bytes.
    fn request(peer: Option<&str>, headers: &[(&str, &[u8])]) -> Request<()> {
        let mut req = Request::new(());
        if let Some(peer) = peer {
            req.extensions_mut().insert(SocketAddr::new(ip(peer), 4000));
        }
        for (name, value) in headers {
            req.headers_mut().append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_bytes(value).unwrap(),
            );
        }
        req
    }

    fn key<E: KeyExtractor<Key = IpKey>>(ex: &E, req: &Request<()>) -> IpAddr {
        ex.extract(&RequestHead::new(req)).unwrap().ip()
    }

    fn xff(peer: &str, chain: &str) -> Request<()> {
        request(Some(peer), &[("x-forwarded-for", chain.as_bytes())])
    }

    fn fwd(peer: &str, value: &str) -> Request<()> {
        request(Some(peer), &[("forwarded", value.as_bytes())])
    }

    fn behind_10_8() -> ClientIp {
        ClientIp::new()
            .trust_proxy("10.0.0.0/8")
            .trust_proxy("fd00::/8")
    }

    #[test]
    fn cidr_parsing_accepts_and_rejects() {
        for (s, shown) in [
            ("10.0.0.0/8", "10.0.0.0/8"),
            ("10.1.2.3/8", "10.0.0.0/8"),
            ("  192.168.1.7 ", "192.168.1.7/32"),
            ("0.0.0.0/0", "0.0.0.0/0"),
            ("1.2.3.4/32", "1.2.3.4/32"),
            ("::1", "::1/128"),
            ("[::1]", "::1/128"),
            ("[fd00::]/8", "fd00::/8"),
            ("2001:db8:abcd:12::1/64", "2001:db8:abcd:12::/64"),
            ("fc00::/7", "fc00::/7"),
            ("::/0", "::/0"),
            ("::ffff:10.0.0.0/104", "10.0.0.0/8"),
            ("::ffff:10.1.2.3", "10.1.2.3/32"),
            ("2001:db8::/008", "2000::/8"),
        ] {
            let c = Cidr::parse(s).unwrap_or_else(|| panic!("{s:?} rejected"));
            assert_eq!(c.to_string(), shown, "{s:?}");
        }
        for s in [
            "",
            "/8",
            "10.0.0.0/",
            "10.0.0.0/33",
            "10.0.0.0/+8",
            "10.0.0.0/-1",
            "10.0.0.0/8/8",
            "10.0.0.0/ 8",
            "10.0.0.0/0x8",
            "10.0.0.0/1000",
            "10.0.0",
            "10.0.0.256",
            "010.0.0.1",
            "10.0.0.1:80",
            "::/129",
            "[::1]:80",
            "[10.0.0.1]",
            "fe80::1%eth0",
            "localhost",
            "*",
        ] {
            assert_eq!(Cidr::parse(s), None, "{s:?} accepted");
        }
    }

    #[test]
    fn cidr_contains_respects_the_prefix() {
        let c = |s| Cidr::parse(s).unwrap();
        assert!(c("10.0.0.0/8").contains(ip("10.255.255.255")));
        assert!(!c("10.0.0.0/8").contains(ip("11.0.0.0")));
        assert!(c("172.16.0.0/12").contains(ip("172.31.0.1")));
        assert!(!c("172.16.0.0/12").contains(ip("172.32.0.1")));
        assert!(c("0.0.0.0/0").contains(ip("203.0.113.7")));
        assert!(!c("0.0.0.0/0").contains(ip("2001:db8::1")));
        assert!(c("1.2.3.4").contains(ip("1.2.3.4")));
        assert!(!c("1.2.3.4").contains(ip("1.2.3.5")));
        assert!(c("fc00::/7").contains(ip("fdff::1")));
        assert!(!c("fc00::/7").contains(ip("fe00::1")));
        assert!(c("::/0").contains(ip("2001:db8::1")));
        assert!(!c("::/0").contains(ip("10.0.0.1")));
        assert!(c("::1").contains(ip("::1")));
        assert!(!c("::1").contains(ip("::2")));
        assert!(c("::ffff:10.0.0.0/104").contains(ip("10.9.9.9")));
    }

    #[test]
    fn ipv6_grouped_by_prefix() {
        let req = request(Some("2001:db8:1:2:3:4:5:6"), &[]);
        assert_eq!(key(&PeerIp::new(), &req), ip("2001:db8:1:2::"));
        assert_eq!(
            key(&PeerIp::new().ipv6_prefix(48), &req),
            ip("2001:db8:1::")
        );
        assert_eq!(
            key(&PeerIp::new().ipv6_prefix(128), &req),
            ip("2001:db8:1:2:3:4:5:6")
        );
        assert_eq!(
            key(&PeerIp::new().ipv6_prefix(200), &req),
            ip("2001:db8:1:2:3:4:5:6")
        );
        assert_eq!(key(&PeerIp::new().ipv6_prefix(0), &req), ip("::"));
        assert_eq!(
            key(
                &PeerIp::new().ipv6_prefix(0),
                &request(Some("1.2.3.4"), &[])
            ),
            ip("1.2.3.4")
        );
        assert_eq!(key(&ClientIp::new(), &req), ip("2001:db8:1:2::"));
        let client = behind_10_8().ipv6_prefix(56);
        let req = xff("10.0.0.1", "2001:db8:1:2ff:3:4:5:6");
        assert_eq!(key(&client, &req), ip("2001:db8:1:200::"));
    }

    #[test]
    fn ipv4_mapped_becomes_ipv4() {
        let req = request(Some("::ffff:203.0.113.7"), &[]);
        assert_eq!(key(&PeerIp::new(), &req), ip("203.0.113.7"));
        assert_eq!(key(&PeerIp::new().ipv6_prefix(0), &req), ip("203.0.113.7"));
        // A mapped peer is trusted as the IPv4 address it is, and mapped entries are IPv4.
        let req = xff(
            "::ffff:10.0.0.1",
            "[::ffff:203.0.113.7]:80, ::ffff:10.0.0.9",
        );
        assert_eq!(key(&behind_10_8(), &req), ip("203.0.113.7"));
    }

    #[test]
    fn missing_peer_is_key_error() {
        let req = request(None, &[("x-forwarded-for", b"203.0.113.7")]);
        let head = RequestHead::new(&req);
        assert!(PeerIp::new().extract(&head).is_err());
        assert!(behind_10_8().extract(&head).is_err());
        assert!(ClientIp::new().trust_private().extract(&head).is_err());
    }

    #[cfg(feature = "axum")]
    #[test]
    fn connect_info_is_the_peer() {
        let mut req = Request::new(());
        req.extensions_mut()
            .insert(axum::extract::ConnectInfo(SocketAddr::new(
                ip("10.0.0.1"),
                1,
            )));
        req.headers_mut()
            .insert("x-forwarded-for", HeaderValue::from_static("203.0.113.7"));
        assert_eq!(key(&PeerIp::new(), &req), ip("10.0.0.1"));
        assert_eq!(key(&behind_10_8(), &req), ip("203.0.113.7"));
    }

    #[test]
    fn no_trusted_proxy_is_peer_ip() {
        let req = request(
            Some("10.0.0.1"),
            &[
                ("x-forwarded-for", b"203.0.113.7"),
                ("forwarded", b"for=203.0.113.8"),
                ("x-real-ip", b"203.0.113.9"),
            ],
        );
        let all = [
            ForwardedHeader::XForwardedFor,
            ForwardedHeader::Forwarded,
            ForwardedHeader::XRealIp,
        ];
        assert_eq!(key(&ClientIp::new(), &req), ip("10.0.0.1"));
        assert_eq!(key(&ClientIp::new().headers(all), &req), ip("10.0.0.1"));
    }

    #[test]
    fn untrusted_peer_headers_are_ignored() {
        let client = behind_10_8().headers([
            ForwardedHeader::XRealIp,
            ForwardedHeader::XForwardedFor,
            ForwardedHeader::Forwarded,
        ]);
        for (name, value) in [
            ("x-forwarded-for", &b"10.0.0.1"[..]),
            ("x-forwarded-for", b"1.1.1.1, 10.0.0.1"),
            ("forwarded", b"for=10.0.0.1"),
            ("x-real-ip", b"1.1.1.1"),
        ] {
            let req = request(Some("198.51.100.9"), &[(name, value)]);
            assert_eq!(key(&client, &req), ip("198.51.100.9"), "{name}: {value:?}");
        }
    }

    #[test]
    fn rightmost_untrusted_address_wins() {
        let req = xff("10.0.0.1", "6.6.6.6, 203.0.113.7, 10.0.0.2, 10.0.0.3");
        assert_eq!(key(&behind_10_8(), &req), ip("203.0.113.7"));
        let req = fwd("10.0.0.1", "for=6.6.6.6, for=203.0.113.7, for=10.0.0.2");
        assert_eq!(key(&behind_10_8(), &req), ip("203.0.113.7"));
    }

    #[test]
    fn all_trusted_chain_uses_leftmost() {
        let req = xff("10.0.0.1", "10.1.1.1, 10.0.0.2, 10.0.0.3");
        assert_eq!(key(&behind_10_8(), &req), ip("10.1.1.1"));
        let req = fwd("10.0.0.1", "for=\"[fd00::7]\", for=10.0.0.2");
        assert_eq!(key(&behind_10_8().ipv6_prefix(128), &req), ip("fd00::7"));
    }

    #[test]
    fn malformed_hop_stops_the_walk() {
        let client = behind_10_8();
        // The nearest hop's view: 10.0.0.2 received it from something unreadable.
        assert_eq!(
            key(&client, &xff("10.0.0.1", "203.0.113.7, garbage, 10.0.0.2")),
            ip("10.0.0.2")
        );
        // Malformed right next to the peer: the peer's own view.
        assert_eq!(
            key(&client, &xff("10.0.0.1", "203.0.113.7, unknown")),
            ip("10.0.0.1")
        );
        // Garbage left of the client is never reached.
        assert_eq!(
            key(&client, &xff("10.0.0.1", "garbage, 203.0.113.7, 10.0.0.2")),
            ip("203.0.113.7")
        );
        let req = fwd("10.0.0.1", "for=203.0.113.7, for=unknown, for=10.0.0.2");
        assert_eq!(key(&client, &req), ip("10.0.0.2"));
    }

    #[test]
    fn empty_elements_are_skipped() {
        let client = behind_10_8();
        assert_eq!(
            key(&client, &xff("10.0.0.1", "203.0.113.7, , 10.0.0.2,")),
            ip("203.0.113.7")
        );
        assert_eq!(key(&client, &xff("10.0.0.1", "")), ip("10.0.0.1"));
        assert_eq!(
            key(
                &client,
                &fwd("10.0.0.1", "for=203.0.113.7,,  ,for=10.0.0.2")
            ),
            ip("203.0.113.7")
        );
    }

    #[test]
    fn multiple_xff_lines_are_concatenated_in_order() {
        let req = request(
            Some("10.0.0.1"),
            &[
                ("x-forwarded-for", b"203.0.113.7, 10.0.0.4"),
                ("x-forwarded-for", b"10.0.0.3, 10.0.0.2"),
            ],
        );
        assert_eq!(key(&behind_10_8(), &req), ip("203.0.113.7"));
        let req = request(
            Some("10.0.0.1"),
            &[
                ("x-forwarded-for", b"10.0.0.4"),
                ("x-forwarded-for", b"203.0.113.7"),
            ],
        );
        assert_eq!(key(&behind_10_8(), &req), ip("203.0.113.7"));
        let req = request(
            Some("10.0.0.1"),
            &[
                ("forwarded", b"for=10.0.0.4, for=203.0.113.7"),
                ("forwarded", b"for=10.0.0.3"),
            ],
        );
        assert_eq!(key(&behind_10_8(), &req), ip("203.0.113.7"));
    }

    #[test]
    fn xff_entries_with_ports_and_whitespace() {
        let client = behind_10_8().ipv6_prefix(128);
        for (chain, want) in [
            ("203.0.113.7:5678", "203.0.113.7"),
            ("\t203.0.113.7 ,10.0.0.2  ", "203.0.113.7"),
            ("[2001:db8::1]:80", "2001:db8::1"),
            ("[2001:db8::1]", "2001:db8::1"),
            ("2001:db8::1", "2001:db8::1"),
            ("203.0.113.7:99999", "10.0.0.1"),
            ("203.0.113.7:", "10.0.0.1"),
            ("[2001:db8::1]80", "10.0.0.1"),
            ("\"203.0.113.7\"", "10.0.0.1"),
        ] {
            assert_eq!(key(&client, &xff("10.0.0.1", chain)), ip(want), "{chain:?}");
        }
    }

    #[test]
    fn forwarded_ipv6_with_port_in_quotes() {
        let client = behind_10_8().ipv6_prefix(128);
        let req = fwd("10.0.0.1", "for=\"[2001:db8:cafe::17]:4711\"");
        assert_eq!(key(&client, &req), ip("2001:db8:cafe::17"));
        let req = fwd("10.0.0.1", "for=\"[2001:db8:cafe::17]:_p1\";proto=https");
        assert_eq!(key(&client, &req), ip("2001:db8:cafe::17"));
        let req = fwd("10.0.0.1", "for=\"\\[2001:db8:cafe::17\\]\"");
        assert_eq!(key(&client, &req), ip("2001:db8:cafe::17"));
    }

    #[test]
    fn forwarded_names_are_case_insensitive_and_quotes_are_honoured() {
        let client = behind_10_8();
        for value in [
            "For=203.0.113.7",
            "FOR=\"203.0.113.7\"",
            "proto=https;for=203.0.113.7;by=10.0.0.2",
            "for=203.0.113.7; proto=https",
            "for=203.0.113.7;;",
            "for=203.0.113.7;ext=\"a, b; for=10.0.0.9\"",
            "for=203.0.113.7;ext=\"quote \\\" comma, \\\\\", for=10.0.0.2",
            "for=6.6.6.6;ext=\"a,b\", for=\"203.0.113.7:80\"",
        ] {
            assert_eq!(
                key(&client, &fwd("10.0.0.1", value)),
                ip("203.0.113.7"),
                "{value:?}"
            );
        }
    }

    #[test]
    fn forwarded_non_addresses_stop_the_walk() {
        let client = behind_10_8();
        for value in [
            "for=unknown",
            "for=_hidden",
            "for=\"_hidden:80\"",
            "proto=https",
            "by=10.0.0.2",
            "for=203.0.113.7;for=203.0.113.8",
            "for=\"203.0.113.7",
            "for=203.0.113.7 junk",
            "for",
            "=203.0.113.7",
            "for=\"\"",
            "for=\"203.0.113.7\"x",
        ] {
            let req = fwd("10.0.0.1", &format!("for=1.1.1.1, {value}"));
            assert_eq!(key(&client, &req), ip("10.0.0.1"), "{value:?}");
        }
    }

    #[test]
    fn x_real_ip_is_one_address_from_a_trusted_peer() {
        let client = behind_10_8().header(ForwardedHeader::XRealIp);
        let one = |peer, v: &[u8]| request(Some(peer), &[("x-real-ip", v)]);
        assert_eq!(
            key(&client, &one("10.0.0.1", b"203.0.113.7")),
            ip("203.0.113.7")
        );
        assert_eq!(
            key(&client, &one("10.0.0.1", b" 203.0.113.7:80 ")),
            ip("203.0.113.7")
        );
        assert_eq!(key(&client, &one("10.0.0.1", b"10.0.0.5")), ip("10.0.0.5"));
        assert_eq!(
            key(&client, &one("198.51.100.9", b"203.0.113.7")),
            ip("198.51.100.9")
        );
        assert_eq!(
            key(&client, &one("10.0.0.1", b"1.1.1.1, 203.0.113.7")),
            ip("10.0.0.1")
        );
        assert_eq!(key(&client, &one("10.0.0.1", b"garbage")), ip("10.0.0.1"));
        assert_eq!(key(&client, &one("10.0.0.1", b"")), ip("10.0.0.1"));
        let two = request(
            Some("10.0.0.1"),
            &[("x-real-ip", b"1.1.1.1"), ("x-real-ip", b"2.2.2.2")],
        );
        assert_eq!(key(&client, &two), ip("10.0.0.1"));
    }

    #[test]
    fn first_configured_header_present_is_the_only_one_read() {
        let both = request(
            Some("10.0.0.1"),
            &[
                ("x-forwarded-for", b"203.0.113.1"),
                ("forwarded", b"for=203.0.113.2"),
                ("x-real-ip", b"203.0.113.3"),
            ],
        );
        let only_fwd = request(Some("10.0.0.1"), &[("forwarded", b"for=203.0.113.2")]);
        let bad_xff = request(
            Some("10.0.0.1"),
            &[
                ("x-forwarded-for", b"junk"),
                ("forwarded", b"for=203.0.113.2"),
            ],
        );
        let default = behind_10_8();
        assert_eq!(key(&default, &both), ip("203.0.113.1"));
        assert_eq!(key(&default, &only_fwd), ip("203.0.113.2"));
        // Present but yielding nothing: no fallback to the next header.
        assert_eq!(key(&default, &bad_xff), ip("10.0.0.1"));
        let fwd_only = behind_10_8().header(ForwardedHeader::Forwarded);
        assert_eq!(key(&fwd_only, &both), ip("203.0.113.2"));
        let real = behind_10_8()
            .header(ForwardedHeader::XForwardedFor)
            .header(ForwardedHeader::XRealIp);
        assert_eq!(key(&real, &both), ip("203.0.113.3"));
        assert_eq!(key(&real, &only_fwd), ip("10.0.0.1"));
        assert_eq!(key(&behind_10_8().headers([]), &both), ip("10.0.0.1"));
        let order = behind_10_8().headers([
            ForwardedHeader::XRealIp,
            ForwardedHeader::Forwarded,
            ForwardedHeader::XRealIp,
        ]);
        assert_eq!(
            order.headers,
            [ForwardedHeader::XRealIp, ForwardedHeader::Forwarded]
        );
        assert_eq!(key(&order, &both), ip("203.0.113.3"));
        assert_eq!(key(&order, &only_fwd), ip("203.0.113.2"));
    }

    #[test]
    fn non_utf8_header_is_ignored_not_a_panic() {
        let client = behind_10_8();
        // The client's garbage is left of what the proxy appended: the proxy's entry still counts.
        let req = request(
            Some("10.0.0.1"),
            &[("x-forwarded-for", b"\xff\xfe, 203.0.113.7")],
        );
        assert_eq!(key(&client, &req), ip("203.0.113.7"));
        // Garbage where the nearest hop should be: the peer's view.
        let req = request(
            Some("10.0.0.1"),
            &[("x-forwarded-for", b"203.0.113.7, 10.0.0.\xe9")],
        );
        assert_eq!(key(&client, &req), ip("10.0.0.1"));
        let req = request(
            Some("10.0.0.1"),
            &[("forwarded", b"for=\"\xff\xff\", for=\xc3\xa9")],
        );
        assert_eq!(key(&client, &req), ip("10.0.0.1"));
        let req = request(
            Some("10.0.0.1"),
            &[("forwarded", b"for=\"\xff,\", for=203.0.113.7")],
        );
        assert_eq!(key(&client, &req), ip("203.0.113.7"));
        let req = request(Some("10.0.0.1"), &[("x-real-ip", b"\x80")]);
        assert_eq!(
            key(&client.header(ForwardedHeader::XRealIp), &req),
            ip("10.0.0.1")
        );
    }

    #[test]
    fn huge_headers_are_bounded_and_harmless() {
        let client = behind_10_8();
        let long = "9".repeat(200_000);
        assert_eq!(key(&client, &xff("10.0.0.1", &long)), ip("10.0.0.1"));
        let quotes = "\"\\".repeat(100_000);
        assert_eq!(key(&client, &fwd("10.0.0.1", &quotes)), ip("10.0.0.1"));
        let commas = ",".repeat(200_000);
        assert_eq!(key(&client, &xff("10.0.0.1", &commas)), ip("10.0.0.1"));
        assert_eq!(key(&client, &fwd("10.0.0.1", &commas)), ip("10.0.0.1"));
        let value = format!("for=\"{}\"", "1".repeat(100_000));
        assert_eq!(key(&client, &fwd("10.0.0.1", &value)), ip("10.0.0.1"));
    }

    #[test]
    fn the_walk_looks_at_most_32_elements() {
        let client = behind_10_8();
        let hops = |n: usize| {
            (1..=n)
                .map(|i| format!("10.0.{}.{}", i / 256, i % 256))
                .collect::<Vec<_>>()
        };
        // 203.0.113.7 then 32 trusted hops: the client is the 33rd element, out of reach.
        let mut chain = vec!["203.0.113.7".to_owned()];
        chain.extend(hops(32));
        assert_eq!(
            key(&client, &xff("10.0.0.1", &chain.join(","))),
            ip("10.0.0.1")
        );
        // 31 trusted hops: the client is the 32nd, within reach.
        let mut chain = vec!["203.0.113.7".to_owned()];
        chain.extend(hops(31));
        assert_eq!(
            key(&client, &xff("10.0.0.1", &chain.join(","))),
            ip("203.0.113.7")
        );
        // Empty elements count too.
        let chain = format!("203.0.113.7{}", ",".repeat(32));
        assert_eq!(key(&client, &xff("10.0.0.1", &chain)), ip("10.0.0.1"));
    }

    #[test]
    fn trusting_reports_bad_entries() {
        assert_eq!(
            ClientIp::new().try_trust_proxy("10.0.0.0/33").unwrap_err(),
            ConfigError::InvalidProxy("10.0.0.0/33".to_owned())
        );
        assert_eq!(
            ClientIp::new()
                .try_trust_proxies(["::1", "bogus", "also bogus"])
                .unwrap_err(),
            ConfigError::InvalidProxy("bogus".to_owned())
        );
        let ok = ClientIp::new()
            .try_trust_proxies(vec![String::from("10.0.0.0/8"), "::1".into()])
            .unwrap();
        assert_eq!(format!("{:?}", ok.trusted), "[10.0.0.0/8, ::1/128]");
        let many = ClientIp::new().trust_proxies(["10.0.0.0/8", "10.0.0.0/8", "10.9.9.9/8"]);
        assert_eq!(many.trusted.len(), 1);
    }

    #[test]
    #[should_panic(expected = "trusted proxy \"10.0.0.0/40\" is not an IP address or CIDR range")]
    fn trust_proxy_panics_on_a_bad_entry() {
        let _ = ClientIp::new().trust_proxy("10.0.0.0/40");
    }

    #[test]
    #[should_panic(expected = "\"nope\" is not an IP address or CIDR range")]
    fn trust_proxies_panics_on_a_bad_entry() {
        let _ = ClientIp::new().trust_proxies(["10.0.0.0/8", "nope"]);
    }

    #[test]
    fn trust_private_and_loopback() {
        let private = ClientIp::new().trust_private();
        for a in [
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.0.1",
            "127.0.0.1",
            "127.9.9.9",
            "::1",
            "fc00::1",
            "fdff::1",
        ] {
            assert!(private.is_trusted(ip(a)), "{a}");
        }
        for a in [
            "11.0.0.1",
            "172.32.0.1",
            "172.15.255.255",
            "192.169.0.1",
            "169.254.1.1",
            "8.8.8.8",
            "::2",
            "fe80::1",
            "2001:db8::1",
        ] {
            assert!(!private.is_trusted(ip(a)), "{a}");
        }
        let lo = ClientIp::new().trust_loopback();
        assert!(lo.is_trusted(ip("127.0.0.1")) && lo.is_trusted(ip("::1")));
        assert!(!lo.is_trusted(ip("10.0.0.1")));
        assert_eq!(key(&lo, &xff("::1", "203.0.113.7")), ip("203.0.113.7"));
        assert_eq!(
            key(&lo, &xff("::ffff:127.0.0.1", "203.0.113.7")),
            ip("203.0.113.7")
        );
    }

    /// (peer, X-Forwarded-For, expected key) for `behind_10_8()`.
    const CHAINS: &[(&str, &str, &str)] = &[
        ("198.51.100.1", "203.0.113.7", "198.51.100.1"),
        ("198.51.100.1", "", "198.51.100.1"),
        ("10.0.0.1", "203.0.113.7", "203.0.113.7"),
        ("10.0.0.1", "1.1.1.1, 203.0.113.7", "203.0.113.7"),
        ("10.0.0.1", "203.0.113.7, 10.0.0.2", "203.0.113.7"),
        ("10.0.0.1", "203.0.113.7,10.0.0.2,10.0.0.3", "203.0.113.7"),
        ("10.0.0.1", "10.0.0.2, 203.0.113.7, 10.0.0.3", "203.0.113.7"),
        ("10.0.0.1", "10.0.0.2", "10.0.0.2"),
        ("10.0.0.1", "10.0.0.5, 10.0.0.2", "10.0.0.5"),
        ("10.0.0.1", "", "10.0.0.1"),
        ("10.0.0.1", " , ", "10.0.0.1"),
        ("10.0.0.1", "junk", "10.0.0.1"),
        ("10.0.0.1", "203.0.113.7, junk", "10.0.0.1"),
        ("10.0.0.1", "203.0.113.7, junk, 10.0.0.2", "10.0.0.2"),
        ("10.0.0.1", "junk, 10.0.0.3, 10.0.0.2", "10.0.0.3"),
        ("10.0.0.1", "junk, 203.0.113.7, 10.0.0.2", "203.0.113.7"),
        ("10.0.0.1", "203.0.113.7:443, 10.0.0.2:80", "203.0.113.7"),
        ("10.0.0.1", "[2001:db8::1]:443, [fd00::2]:80", "2001:db8::"),
        ("10.0.0.1", "2001:db8:0:0:ffff::1, fd00::2", "2001:db8::"),
        ("10.0.0.1", "::ffff:203.0.113.7", "203.0.113.7"),
        ("10.0.0.1", "::ffff:10.0.0.9", "10.0.0.9"),
        ("10.0.0.1", "unknown", "10.0.0.1"),
        ("10.0.0.1", "203.0.113.7, 10.0.0.256", "10.0.0.1"),
        ("fd00::1", "203.0.113.7, fd00::3", "203.0.113.7"),
        ("::ffff:10.0.0.1", "203.0.113.7", "203.0.113.7"),
        ("::ffff:198.51.100.1", "203.0.113.7", "198.51.100.1"),
        ("2001:db8::1", "203.0.113.7", "2001:db8::"),
    ];

    #[test]
    fn chains_table() {
        let client = behind_10_8();
        for &(peer, chain, want) in CHAINS {
            assert_eq!(
                key(&client, &xff(peer, chain)),
                ip(want),
                "peer {peer}, chain {chain:?}"
            );
        }
    }

    /// xorshift64: a small deterministic generator, enough to spread inputs around.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }

        fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
            &items[self.below(items.len())]
        }
    }

    #[test]
    fn garbage_never_panics() {
        // Bytes that matter to the parsers, plus anything at all.
        const ALPHABET: &[u8] = b"0123456789abcdefABCDEFforFOR.:[]_,;=\"\\ \t/%-xyz";
        let client = behind_10_8().headers([
            ForwardedHeader::XForwardedFor,
            ForwardedHeader::Forwarded,
            ForwardedHeader::XRealIp,
        ]);
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for round in 0..5000 {
            let len = rng.below(if round % 100 == 0 { 2000 } else { 60 });
            let bytes: Vec<u8> = (0..len)
                .map(|_| match rng.below(10) {
                    0 => rng.next() as u8,
                    _ => *rng.pick(ALPHABET),
                })
                .collect();
            let text = String::from_utf8_lossy(&bytes);
            let _ = Cidr::parse(&text);
            let _ = parse_node(&bytes);
            let _ = xff_hop(&bytes);
            let _ = forwarded_hop(&bytes);
            let _ = RevElements(Some(&bytes)).map(forwarded_hop).count();
            let _ = ClientIp::new().try_trust_proxy(&text);
            let Ok(value) = HeaderValue::from_bytes(&bytes) else {
                continue;
            };
            for name in ["x-forwarded-for", "forwarded", "x-real-ip"] {
                let mut req = request(Some("10.0.0.1"), &[]);
                req.headers_mut().append(name, value.clone());
                let _ = key(&client, &req);
                // From an untrusted peer, nothing a client sends changes the key.
                req.extensions_mut()
                    .insert(SocketAddr::new(ip("198.51.100.9"), 1));
                assert_eq!(key(&client, &req), ip("198.51.100.9"), "{bytes:?}");
            }
        }
    }

    /// What the walk should find, computed the simple way over a list of parsed hops.
    fn model(client: &ClientIp, peer: IpAddr, hops: &[Option<IpAddr>]) -> IpAddr {
        let mut nearest = peer;
        for hop in hops.iter().rev().take(MAX_HOPS) {
            match hop {
                None => return nearest,
                Some(ip) if !client.is_trusted(*ip) => return *ip,
                Some(ip) => nearest = *ip,
            }
        }
        nearest
    }

    #[test]
    fn random_chains_agree_with_the_model_in_both_headers() {
        let client = behind_10_8().ipv6_prefix(128);
        let pool: &[Option<&str>] = &[
            Some("10.0.0.2"),
            Some("10.9.8.7"),
            Some("fd00::5"),
            Some("203.0.113.7"),
            Some("198.51.100.1"),
            Some("2001:db8::1"),
            None,
        ];
        let mut rng = Rng(42);
        for _ in 0..3000 {
            let n = rng.below(40);
            let hops: Vec<Option<IpAddr>> = (0..n).map(|_| rng.pick(pool).map(ip)).collect();
            let want = model(&client, ip("10.0.0.1"), &hops);
            // X-Forwarded-For: random ports and blanks, split over random lines.
            let mut lines = vec![String::new()];
            for hop in &hops {
                let entry = match (hop, rng.below(3)) {
                    (None, _) => "junk".to_owned(),
                    (Some(a @ IpAddr::V4(_)), 0) => format!("{a}:{}", rng.below(65536)),
                    (Some(a @ IpAddr::V6(_)), 0) => format!("[{a}]:{}", rng.below(65536)),
                    (Some(a), _) => a.to_string(),
                };
                let line = lines.last_mut().unwrap();
                if !line.is_empty() {
                    line.push_str(if rng.below(2) == 0 { ", " } else { "," });
                }
                line.push_str(&entry);
                if rng.below(4) == 0 {
                    lines.push(String::new());
                }
            }
            let mut req = request(Some("10.0.0.1"), &[]);
            for line in &lines {
                req.headers_mut()
                    .append("x-forwarded-for", HeaderValue::from_str(line).unwrap());
            }
            assert_eq!(key(&client, &req), want, "{lines:?}");
            // Forwarded: random case, quoting and other parameters.
            let elements: Vec<String> = hops
                .iter()
                .map(|hop| {
                    let name = *rng.pick(&["for", "For", "FOR"]);
                    let node = match hop {
                        None => rng.pick(&["unknown", "_hidden", "\"_x:1\""]).to_string(),
                        Some(a @ IpAddr::V4(_)) if rng.below(2) == 0 => a.to_string(),
                        Some(a @ IpAddr::V4(_)) => format!("\"{a}:8080\""),
                        Some(a) => format!("\"[{a}]\""),
                    };
                    match rng.below(3) {
                        0 => format!("{name}={node}"),
                        1 => format!("proto=https;{name}={node}"),
                        _ => format!("{name}={node};by=\"a,b\\\"\""),
                    }
                })
                .collect();
            let req = fwd("10.0.0.1", &elements.join(", "));
            assert_eq!(key(&client, &req), want, "{elements:?}");
        }
    }
}
