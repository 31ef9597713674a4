//! [`ClientIp`]: the client's address behind trusted proxies, found by walking the forwarding
//! chain from the right.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use http::{HeaderMap, HeaderName};

use super::cidr::Cidr;
use super::forwarded::{forwarded_hop, real_ip, xff_hop, Hop, RevElements};
use super::{group, peer_addr, IpKey, PeerIp, MISSING_PEER};
use crate::key::{KeyError, KeyExtractor, RequestHead};
use crate::ConfigError;

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

pub(super) static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
pub(super) static X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");

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
pub(super) const MAX_HOPS: usize = 32;

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
    pub(super) peer: PeerIp,
    pub(super) trusted: Vec<Cidr>,
    pub(super) headers: Vec<ForwardedHeader>,
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
    /// list reads no header: the key is the peer address. The default list is
    /// `X-Forwarded-For`, then `Forwarded`.
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

    pub(super) fn add(&mut self, cidr: Cidr) {
        if !self.trusted.contains(&cidr) {
            self.trusted.push(cidr);
        }
    }

    /// Whether `ip` (canonical form) is a trusted proxy.
    pub(super) fn is_trusted(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|c| c.contains(ip))
    }

    /// The client address (not grouped) of a request from `peer` (canonical form).
    pub(super) fn client(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
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
    pub(super) fn walk(&self, peer: IpAddr, hops: impl Iterator<Item = Hop>) -> IpAddr {
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
    fn client_ip(&self, req: &RequestHead<'_>) -> Option<IpAddr> {
        let peer = peer_addr(req)?.ip().to_canonical();
        Some(self.client(peer, req.headers).to_canonical())
    }
    fn describe(&self) -> Option<String> {
        Some(format!("client-ip/{}", self.peer.v6_prefix))
    }
}
