//! Which address a request came from: the socket's peer, or, when the peer
//! is a reverse proxy we were told to trust, the client it names in
//! `X-Forwarded-For`. From anyone else that header is ignored: a client
//! could write anything there.

use std::{
    net::{IpAddr, SocketAddr},
    sync::Arc,
};

use axum::{
    extract::{ConnectInfo, FromRequestParts},
    http::request::Parts,
};
use ipnet::IpNet;

/// The reverse proxies whose `X-Forwarded-For` is believed (from
/// `--trusted-proxy`), put into every request by the router.
#[derive(Debug, Clone, Default)]
pub struct TrustedProxies(pub Arc<Vec<IpNet>>);

/// The client's address (absent in in-process tests without a socket).
pub struct ClientIp(pub Option<IpAddr>);

impl<S: Send + Sync> FromRequestParts<S> for ClientIp {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let Some(ConnectInfo(peer)) = parts.extensions.get::<ConnectInfo<SocketAddr>>() else {
            return Ok(Self(None));
        };
        let trusted = parts
            .extensions
            .get::<TrustedProxies>()
            .map(|proxies| proxies.0.as_slice())
            .unwrap_or_default();
        // Every X-Forwarded-For header, in order, as one list of hops.
        let hops: Vec<&str> = parts
            .headers
            .get_all("x-forwarded-for")
            .iter()
            .filter_map(|value| value.to_str().ok())
            .flat_map(|value| value.split(','))
            .collect();
        Ok(Self(Some(client_ip(peer.ip(), &hops, trusted))))
    }
}

/// Walks the hops from the nearest (rightmost) back, for as long as the
/// address reached is a trusted proxy: the first one that is not is the
/// client. A missing or unreadable hop stops the walk at the last proxy.
pub fn client_ip(peer: IpAddr, hops: &[&str], trusted: &[IpNet]) -> IpAddr {
    let is_trusted = |ip: &IpAddr| trusted.iter().any(|net| net.contains(ip));
    let mut client = peer.to_canonical();
    let mut hops = hops.iter().rev();
    while is_trusted(&client) {
        match hops.next().and_then(|hop| parse_hop(hop.trim())) {
            Some(ip) => client = ip.to_canonical(),
            None => break,
        }
    }
    client
}

/// `198.51.100.1`, `198.51.100.1:4000`, `2001:db8::1` or `[2001:db8::1]:4000`.
fn parse_hop(hop: &str) -> Option<IpAddr> {
    hop.parse::<IpAddr>().ok().or_else(|| {
        hop.parse::<std::net::SocketAddr>()
            .ok()
            .map(|addr| addr.ip())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn the_header_counts_only_through_trusted_proxies() {
        let trusted: Vec<IpNet> = vec!["10.0.0.0/8".parse().unwrap()];
        let client = |peer: &str, hops: &[&str]| client_ip(ip(peer), hops, &trusted);
        // Straight from the internet: whatever it claims is ignored.
        assert_eq!(client("203.0.113.9", &["198.51.100.1"]), ip("203.0.113.9"));
        // Through our proxy: the address it saw.
        assert_eq!(client("10.0.0.2", &["198.51.100.1"]), ip("198.51.100.1"));
        // A client that forges the header behind our proxy: its own
        // address is the rightmost untrusted hop, the forgery is left of it.
        assert_eq!(
            client("10.0.0.2", &["1.2.3.4", " 198.51.100.1"]),
            ip("198.51.100.1")
        );
        // Two of our proxies in a row.
        assert_eq!(
            client("10.0.0.2", &["198.51.100.1", "10.0.0.3"]),
            ip("198.51.100.1")
        );
        // Our proxy sent nothing readable: the proxy is all we know.
        assert_eq!(client("10.0.0.2", &[]), ip("10.0.0.2"));
        assert_eq!(client("10.0.0.2", &["unknown"]), ip("10.0.0.2"));
        // Some proxies write the client's port too.
        assert_eq!(
            client("10.0.0.2", &["198.51.100.1:4000"]),
            ip("198.51.100.1")
        );
        assert_eq!(
            client("10.0.0.2", &["[2001:db8::1]:4000"]),
            ip("2001:db8::1")
        );
        // IPv4 seen through an IPv6 socket is the same address.
        assert_eq!(
            client("::ffff:10.0.0.2", &["198.51.100.1"]),
            ip("198.51.100.1")
        );
    }
}
