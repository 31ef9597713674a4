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

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use super::{KeyError, KeyExtractor, RequestHead};

mod cidr;
mod client;
mod forwarded;

use cidr::mask128;
pub(crate) use cidr::Cidr;
pub use client::{ClientIp, ForwardedHeader};

/// The address of the TCP peer (axum's `ConnectInfo<SocketAddr>`, tonic's `TcpConnectInfo`
/// with the `tonic` feature, or a `SocketAddr` in the request extensions).
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
/// with a plain `axum::serve(listener, app)`, no request has a peer address: that is a server
/// bug, not a client's, so every layer keyed by `PeerIp` or [`ClientIp`] logs an error through
/// `tracing` the first time (once per layer, naming this fix) and answers each request with
/// its missing-key answer ([`MissingKey`](crate::MissingKey), `400 Bad Request` by default).
/// With other servers, insert the peer's `SocketAddr` into the request extensions.
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

    /// Groups IPv6 addresses by their first `bits` bits (default 64): `128` keys every address
    /// on its own, `48` keys a whole site, `0` puts all of IPv6 in one bucket. Values above 128
    /// mean 128. IPv4 addresses are never grouped.
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
    #[cfg(feature = "tonic")]
    if let Some(ci) = req
        .extensions
        .get::<tonic::transport::server::TcpConnectInfo>()
    {
        return ci.remote_addr();
    }
    req.extensions.get::<SocketAddr>().copied()
}

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

/// The key of `ip`: IPv4-mapped IPv6 becomes IPv4, other IPv6 is cut to `v6_prefix` bits.
fn group(ip: IpAddr, v6_prefix: u8) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & mask128(v6_prefix))),
    }
}

impl KeyExtractor for PeerIp {
    type Key = IpKey;
    fn extract(&self, req: &RequestHead<'_>) -> Result<IpKey, KeyError> {
        peer_addr(req)
            .map(|a| IpKey::from(group(a.ip(), self.v6_prefix)))
            .ok_or(MISSING_PEER)
    }
    fn client_ip(&self, req: &RequestHead<'_>) -> Option<IpAddr> {
        peer_addr(req).map(|a| a.ip().to_canonical())
    }
    fn describe(&self) -> Option<String> {
        Some(format!("peer-ip/{}", self.v6_prefix))
    }
}

/// Without a peer address no request has a key: the server was not served with
/// `into_make_service_with_connect_info::<SocketAddr>()` (axum), or no `SocketAddr` was put in
/// the request extensions.
const MISSING_PEER: KeyError = KeyError::misconfigured(
    "no peer address: serve the app with \
     `into_make_service_with_connect_info::<std::net::SocketAddr>()` (axum) or put a \
     `ConnectInfo<SocketAddr>` / `SocketAddr` in the request extensions",
);

#[cfg(test)]
mod tests {
    use super::cidr::*;
    use super::client::*;
    use super::forwarded::*;
    use super::*;
    use crate::ConfigError;
    use http::HeaderName;
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
