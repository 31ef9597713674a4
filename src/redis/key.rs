//! [`RedisKey`]: how a limiter key is written into a Redis key name.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::rc::Rc;
use std::sync::Arc;

/// Writes a limiter key as the bytes of a Redis key name.
///
/// The encoding must be unambiguous within one key type: two different keys must never write
/// the same bytes. Implemented for the key types of the built-in extractors (`()`, `IpKey`, `IpAddr`,
/// `Box<[u8]>`, `Arc<str>`), for strings, byte strings, integers and `bool`, and for tuples of
/// up to four of them, whose parts are each written as `<length>:<bytes>`.
///
/// The full name of a key is `<prefix><policy length>:<policy>:<key>`, e.g.
/// `tollgate:7:default:203.0.113.9` (see [`RedisStore::prefix`](super::RedisStore::prefix)).
///
/// ```
/// use tollgate::redis::RedisKey;
///
/// let mut out = Vec::new();
/// ("tenant", 42u64).write_key(&mut out);
/// assert_eq!(out, b"6:tenant2:42");
///
/// // A key type of your own: write something unique to it.
/// #[derive(Clone, PartialEq, Eq, Hash, Debug)]
/// struct UserId(u64);
/// impl RedisKey for UserId {
///     fn write_key(&self, out: &mut Vec<u8>) {
///         self.0.write_key(out)
///     }
/// }
/// ```
pub trait RedisKey {
    /// Appends this key's bytes to `out`.
    fn write_key(&self, out: &mut Vec<u8>);
}

impl<T: RedisKey + ?Sized> RedisKey for &T {
    fn write_key(&self, out: &mut Vec<u8>) {
        (**self).write_key(out)
    }
}

impl<T: RedisKey + ?Sized> RedisKey for Box<T> {
    fn write_key(&self, out: &mut Vec<u8>) {
        (**self).write_key(out)
    }
}

impl<T: RedisKey + ?Sized> RedisKey for Arc<T> {
    fn write_key(&self, out: &mut Vec<u8>) {
        (**self).write_key(out)
    }
}

impl<T: RedisKey + ?Sized> RedisKey for Rc<T> {
    fn write_key(&self, out: &mut Vec<u8>) {
        (**self).write_key(out)
    }
}

impl RedisKey for () {
    fn write_key(&self, _: &mut Vec<u8>) {}
}

impl RedisKey for [u8] {
    fn write_key(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self)
    }
}

impl RedisKey for Vec<u8> {
    fn write_key(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self)
    }
}

impl RedisKey for str {
    fn write_key(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.as_bytes())
    }
}

impl RedisKey for String {
    fn write_key(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.as_bytes())
    }
}

impl RedisKey for bool {
    fn write_key(&self, out: &mut Vec<u8>) {
        out.push(if *self { b'1' } else { b'0' })
    }
}

/// Writes `Display` output straight into the buffer.
fn write_display(out: &mut Vec<u8>, v: impl std::fmt::Display) {
    use std::io::Write;
    // Writing into a `Vec` cannot fail.
    let _ = write!(out, "{v}");
}

macro_rules! display_key {
    ($($t:ty),*) => {$(
        impl RedisKey for $t {
            fn write_key(&self, out: &mut Vec<u8>) {
                write_display(out, self)
            }
        }
    )*};
}

// Decimal integers; addresses in their canonical text form (IPv6 compressed, lower case).
display_key!(u8, u16, u32, u64, u128, usize, i8, i16, i32, i64, i128, isize);
display_key!(IpAddr, Ipv4Addr, Ipv6Addr, crate::key::IpKey);

/// Writes one part of a composite key as `<length>:<bytes>`.
fn write_part(out: &mut Vec<u8>, part: &impl RedisKey) {
    let start = out.len();
    part.write_key(out);
    let len = out.len() - start;
    let mut prefix = Vec::with_capacity(8);
    write_display(&mut prefix, len);
    prefix.push(b':');
    out.splice(start..start, prefix);
}

macro_rules! tuple_key {
    ($($name:ident $idx:tt),+) => {
        impl<$($name: RedisKey),+> RedisKey for ($($name,)+) {
            fn write_key(&self, out: &mut Vec<u8>) {
                $(write_part(out, &self.$idx);)+
            }
        }
    };
}

tuple_key!(A 0);
tuple_key!(A 0, B 1);
tuple_key!(A 0, B 1, C 2);
tuple_key!(A 0, B 1, C 2, D 3);

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(k: impl RedisKey) -> Vec<u8> {
        let mut out = Vec::new();
        k.write_key(&mut out);
        out
    }

    #[test]
    fn built_in_key_types_write_readable_bytes() {
        assert_eq!(bytes(()), b"");
        assert_eq!(bytes("abc"), b"abc");
        assert_eq!(bytes(Box::<[u8]>::from(&b"k\x00y"[..])), b"k\x00y");
        assert_eq!(bytes(Arc::<str>::from("/users/{id}")), b"/users/{id}");
        assert_eq!(bytes(IpAddr::from([203, 0, 113, 9])), b"203.0.113.9");
        // PeerIp's key writes the same bytes as the address it stands for.
        let ip = crate::key::IpKey::from(IpAddr::from([203, 0, 113, 9]));
        assert_eq!(bytes(ip), b"203.0.113.9");
        assert_eq!(
            bytes("2001:db8::1".parse::<IpAddr>().unwrap()),
            b"2001:db8::1"
        );
        assert_eq!(bytes(-42i64), b"-42");
    }

    #[test]
    fn tuple_parts_are_length_prefixed_so_splits_never_collide() {
        assert_eq!(bytes(("a:b", "c")), b"3:a:b1:c");
        assert_ne!(bytes(("ab", "c")), bytes(("a", "bc")));
        assert_ne!(bytes(("1:a", "")), bytes(("", "a")));
        assert_eq!(bytes((1u8, (), "x")), b"1:10:1:x");
    }
}
