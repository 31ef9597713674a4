//! Key extractors for gRPC calls: the method, and a metadata entry.
//!
//! The peer address of a tonic server is read by [`PeerIp`](super::PeerIp) (tonic's
//! `TcpConnectInfo`, with the crate's `tonic` feature).

use std::sync::Arc;

use http::HeaderName;

use super::{KeyError, KeyExtractor, RequestHead};

/// The full method name of a gRPC call, `/package.Service/Method` (the request path): one
/// bucket per method, or per method and client in a tuple.
///
/// ```
/// use tollgate::key::{GrpcMethod, KeyExtractor, RequestHead};
///
/// let req = http::Request::builder().uri("/helloworld.Greeter/SayHello").body(())?;
/// assert_eq!(&*GrpcMethod.extract(&RequestHead::new(&req))?, "/helloworld.Greeter/SayHello");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// A path that is not of the form `/service/method` (a plain HTTP request on the same port)
/// has no key.
#[derive(Debug, Clone, Copy, Default)]
pub struct GrpcMethod;

impl KeyExtractor for GrpcMethod {
    type Key = Arc<str>;
    fn extract(&self, req: &RequestHead<'_>) -> Result<Self::Key, KeyError> {
        let path = req.uri.path();
        match path.strip_prefix('/').and_then(|p| p.split_once('/')) {
            Some((service, method))
                if !service.is_empty() && !method.is_empty() && !method.contains('/') =>
            {
                Ok(super::bounded_str(path))
            }
            _ => Err(KeyError::new("not a gRPC method path")),
        }
    }
    fn describe(&self) -> Option<String> {
        Some("grpc-method".to_owned())
    }
}

/// The value of an ASCII metadata entry of a gRPC call (a request header), e.g. a tenant or an
/// API key. Calls without it, or with an empty value, have no key.
///
/// Binary metadata (names ending in `-bin`) is refused when the extractor is made: its values
/// are base64 text whose padding is optional, so one value has several spellings and a client
/// could spread itself over several buckets.
///
/// ```
/// use tollgate::key::{KeyExtractor, Metadata, RequestHead};
///
/// let req = http::Request::builder().header("x-tenant", "acme").body(())?;
/// assert_eq!(&*Metadata::new("x-tenant").extract(&RequestHead::new(&req))?, "acme");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct Metadata {
    name: HeaderName,
}

impl Metadata {
    /// Keys calls by the ASCII metadata entry `name` (lower case, as gRPC sends it).
    ///
    /// # Panics
    /// At the caller's line, when `name` is not a valid metadata name or is a binary (`-bin`)
    /// one; see [`try_new`](Self::try_new).
    #[track_caller]
    pub fn new(name: &str) -> Self {
        match Self::try_new(name) {
            Ok(m) => m,
            Err(e) => panic!("tollgate: {e}"),
        }
    }

    /// Keys calls by the ASCII metadata entry `name`, or
    /// [`ConfigError::InvalidMetadataName`](crate::ConfigError::InvalidMetadataName) when `name`
    /// is not a valid metadata name or is a binary (`-bin`) one.
    pub fn try_new(name: &str) -> Result<Self, crate::ConfigError> {
        let invalid = || crate::ConfigError::InvalidMetadataName(name.to_owned());
        let name = HeaderName::try_from(name).map_err(|_| invalid())?;
        if name.as_str().ends_with("-bin") {
            return Err(invalid());
        }
        Ok(Metadata { name })
    }
}

impl KeyExtractor for Metadata {
    type Key = Arc<str>;
    fn extract(&self, req: &RequestHead<'_>) -> Result<Self::Key, KeyError> {
        match req.headers.get(&self.name).map(|v| v.to_str()) {
            Some(Ok(v)) if !v.is_empty() => Ok(super::bounded_str(v)),
            Some(Err(_)) => Err(KeyError::new("metadata value is not ASCII")),
            _ => Err(KeyError::new("missing metadata")),
        }
    }
    fn describe(&self) -> Option<String> {
        Some(format!("metadata:{}", self.name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key_of<E: KeyExtractor>(e: &E, path: &str) -> Result<E::Key, KeyError> {
        let req = http::Request::builder().uri(path).body(()).unwrap();
        e.extract(&RequestHead::new(&req))
    }

    #[test]
    fn method_key_is_the_full_path_and_other_paths_have_none() {
        assert_eq!(&*key_of(&GrpcMethod, "/a.B/C").unwrap(), "/a.B/C");
        assert_eq!(
            &*key_of(&GrpcMethod, "/grpc.health.v1.Health/Check").unwrap(),
            "/grpc.health.v1.Health/Check"
        );
        for bad in ["/", "/a.B", "/a.B/", "//C", "/a/b/c", "/a.B/C/"] {
            assert!(key_of(&GrpcMethod, bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn metadata_key_needs_a_non_empty_ascii_value() {
        let m = Metadata::new("x-tenant");
        let req = http::Request::builder()
            .header("x-tenant", "acme")
            .body(())
            .unwrap();
        assert_eq!(&*m.extract(&RequestHead::new(&req)).unwrap(), "acme");
        let empty = http::Request::builder()
            .header("x-tenant", "")
            .body(())
            .unwrap();
        assert!(m.extract(&RequestHead::new(&empty)).is_err());
        let opaque = http::Request::builder()
            .header("x-tenant", http::HeaderValue::from_bytes(b"\xff").unwrap())
            .body(())
            .unwrap();
        assert!(m.extract(&RequestHead::new(&opaque)).is_err());
        let none = http::Request::builder().body(()).unwrap();
        assert!(m.extract(&RequestHead::new(&none)).is_err());
    }

    #[test]
    fn binary_and_invalid_metadata_names_are_refused() {
        assert!(Metadata::try_new("x-key-bin").is_err());
        assert!(Metadata::try_new("bad name").is_err());
        assert!(Metadata::try_new("x-key").is_ok());
    }
}
