//! The three forwarding headers read as lists of hops: `X-Forwarded-For`, `Forwarded`
//! (RFC 7239) and `X-Real-IP`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use http::header::ValueIter;
use http::HeaderValue;

/// One element of a forwarding chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Hop {
    /// An empty list element (`a,,b`): ignored, as RFC 9110 asks.
    Empty,
    /// An address.
    Addr(IpAddr),
    /// Anything else: the walk stops.
    Malformed,
}

/// The address of an `X-Real-IP` header: one line holding one entry, else `None`.
pub(super) fn real_ip(mut lines: ValueIter<'_, HeaderValue>) -> Option<IpAddr> {
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
pub(super) const MAX_NODE_LEN: usize = 64;

/// An `X-Forwarded-For` entry.
pub(super) fn xff_hop(entry: &[u8]) -> Hop {
    let entry = entry.trim_ascii();
    if entry.is_empty() {
        return Hop::Empty;
    }
    parse_node(entry).map_or(Hop::Malformed, Hop::Addr)
}

/// `192.0.2.1`, `192.0.2.1:80`, `2001:db8::1`, `[2001:db8::1]`, `[2001:db8::1]:80`; the port
/// may be an RFC 7239 obfuscated port (`_p1`).
pub(super) fn parse_node(node: &[u8]) -> Option<IpAddr> {
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
pub(super) fn valid_port(port: &str) -> bool {
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
pub(super) struct RevElements<'a>(pub(super) Option<&'a [u8]>);

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
pub(super) fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// One `Forwarded` element: `for=...;proto=...;by=...`. Its `for=` node is the hop; an element
/// without exactly one `for=`, or that does not parse, is malformed.
pub(super) fn forwarded_hop(element: &[u8]) -> Hop {
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
pub(super) struct Value {
    buf: [u8; MAX_NODE_LEN],
    len: usize,
    too_long: bool,
}

impl Value {
    pub(super) fn new() -> Self {
        Value {
            buf: [0; MAX_NODE_LEN],
            len: 0,
            too_long: false,
        }
    }

    pub(super) fn of(bytes: &[u8]) -> Self {
        let mut v = Value::new();
        for &b in bytes {
            v.push(b);
        }
        v
    }

    pub(super) fn push(&mut self, b: u8) {
        match self.buf.get_mut(self.len) {
            Some(slot) => {
                *slot = b;
                self.len += 1;
            }
            None => self.too_long = true,
        }
    }

    pub(super) fn as_bytes(&self) -> Option<&[u8]> {
        if self.too_long {
            None
        } else {
            self.buf.get(..self.len)
        }
    }
}

/// The rest of a quoted string whose opening quote was consumed: its unescaped value and what
/// follows the closing quote. `None` when it is not closed.
pub(super) fn unquote(s: &[u8]) -> Option<(Value, &[u8])> {
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
