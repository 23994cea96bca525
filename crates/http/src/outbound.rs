//! Where the server's own requests may go.
//!
//! The problem: a tenant hands the server URLs it will fetch (an image's
//! registry at submit, a webhook's receiver on every event). Pointed at
//! the server's own loopback, at a cloud's metadata service
//! (`169.254.169.254`), or at an address that only looks public
//! (`[::ffff:127.0.0.1]`, `0.0.0.0`, a name that resolves to loopback,
//! or to it only after it was checked), those requests reach what the
//! tenant cannot.
//!
//! So the check is made on the address actually connected to: requests
//! go through a client whose resolver ([`Outbound::resolver`]) drops the
//! addresses this policy refuses, and a URL whose host is an address
//! ([`Outbound::check_url`]) is checked before it is sent. Refused:
//! loopback, unspecified (`0.0.0.0/8`, `::`), link-local (a cloud's
//! metadata service), multicast and broadcast, each in its IPv4-mapped,
//! IPv4-compatible and NAT64 forms too, and the server's own listening
//! address. Private networks are allowed (a registry or a receiver on
//! the operator's network); an operator allows any refused range with
//! `--outbound-allow CIDR` (`ebb up`, a cluster on one machine, allows
//! loopback).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

/// The policy.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outbound {
    /// Ranges the operator allowed, refused or not.
    allowed: Vec<(IpAddr, u8)>,
    /// The server's own addresses.
    own: Vec<IpAddr>,
}

/// Why a request may not connect to an address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("{0} is this server's own address")]
    Own(IpAddr),
    #[error("{ip} is {class} (an operator allows it with --outbound-allow)")]
    Class { ip: IpAddr, class: &'static str },
    #[error("the URL has no host")]
    NoHost,
}

/// An `--outbound-allow` range that is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--outbound-allow {text:?}: {why} (ADDRESS or ADDRESS/BITS)")]
pub struct NotARange {
    text: String,
    why: String,
}

impl Outbound {
    /// The policy with `allowed` ranges (`ADDRESS/BITS`, or an address)
    /// let through.
    pub fn new(allowed: &[String]) -> Result<Outbound, NotARange> {
        let allowed = allowed.iter().map(|a| parse_cidr(a)).collect::<Result<_, _>>()?;
        Ok(Outbound { allowed, own: Vec::new() })
    }

    /// Loopback let through: a cluster on one machine.
    pub fn with_loopback() -> Outbound {
        Outbound {
            allowed: vec![(IpAddr::V4(Ipv4Addr::LOCALHOST), 8), (IpAddr::V6(Ipv6Addr::LOCALHOST), 128)],
            own: Vec::new(),
        }
    }

    /// `ip`, where the server listens, refused too (an unspecified
    /// address is every interface's, and refused anyway).
    pub fn with_own(mut self, ip: IpAddr) -> Outbound {
        if !ip.is_unspecified() {
            self.own.push(ip.to_canonical());
        }
        self
    }

    /// Whether a request may connect to `ip`; if not, why, in words.
    pub fn check(&self, ip: IpAddr) -> Result<(), Refused> {
        let ip = ip.to_canonical();
        if self.allowed.iter().any(|(net, bits)| contains(*net, *bits, ip)) {
            return Ok(());
        }
        if self.own.contains(&ip) {
            return Err(Refused::Own(ip));
        }
        match refused_class(ip) {
            Some(class) => Err(Refused::Class { ip, class }),
            None => Ok(()),
        }
    }

    /// Checks a URL's host where it is an address (a name is checked
    /// as it is resolved).
    pub fn check_url(&self, url: &reqwest::Url) -> Result<(), Refused> {
        let host = url.host_str().ok_or(Refused::NoHost)?;
        match host.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>() {
            Ok(ip) => self.check(ip),
            Err(_) => Ok(()),
        }
    }

    /// A resolver for `reqwest::ClientBuilder::dns_resolver` that gives
    /// only the addresses this policy lets through.
    pub fn resolver(&self) -> Arc<Outbound> {
        Arc::new(self.clone())
    }
}

impl reqwest::dns::Resolve for Outbound {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let policy = self.clone();
        let host = name.as_str().to_string();
        Box::pin(async move {
            let found: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let mut refused = None;
            let allowed: Vec<SocketAddr> = found
                .into_iter()
                .filter(|a| match policy.check(a.ip()) {
                    Ok(()) => true,
                    Err(why) => {
                        refused.get_or_insert(why);
                        false
                    }
                })
                .collect();
            if allowed.is_empty() {
                let why = refused.map_or_else(|| "no address".to_string(), |r| r.to_string());
                let error: Box<dyn std::error::Error + Send + Sync> = format!("{host}: {why}").into();
                return Err(error);
            }
            Ok(Box::new(allowed.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// What kind of address refused `ip` is, if it is one.
fn refused_class(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => refused_v4(v4),
        IpAddr::V6(v6) => {
            let s = v6.segments();
            // IPv4-compatible (::a.b.c.d, deprecated) and NAT64
            // (64:ff9b::a.b.c.d) carry an IPv4 address a host may reach.
            let embedded = (s[..6] == [0; 6] && !v6.is_unspecified() && !v6.is_loopback())
                || s[..6] == [0x64, 0xff9b, 0, 0, 0, 0];
            if embedded {
                let o = v6.octets();
                return refused_v4(Ipv4Addr::new(o[12], o[13], o[14], o[15]));
            }
            if v6.is_loopback() {
                Some("a loopback address")
            } else if v6.is_unspecified() {
                Some("the unspecified address")
            } else if s[0] & 0xffc0 == 0xfe80 {
                Some("a link-local address (a cloud's metadata service answers there)")
            } else if v6.is_multicast() {
                Some("a multicast address")
            } else {
                None
            }
        }
    }
}

fn refused_v4(ip: Ipv4Addr) -> Option<&'static str> {
    if ip.is_loopback() {
        Some("a loopback address")
    } else if ip.octets()[0] == 0 {
        Some("an unspecified address")
    } else if ip.is_link_local() {
        Some("a link-local address (a cloud's metadata service answers there)")
    } else if ip.is_broadcast() || ip.is_multicast() {
        Some("a broadcast or multicast address")
    } else {
        None
    }
}

fn parse_cidr(text: &str) -> Result<(IpAddr, u8), NotARange> {
    let bad = |why: &str| NotARange { text: text.to_string(), why: why.to_string() };
    let (address, bits) = match text.split_once('/') {
        Some((a, b)) => (a, Some(b)),
        None => (text, None),
    };
    let address: IpAddr = address.parse().map_err(|_| bad("not an IP address"))?;
    let address = address.to_canonical();
    let max = if address.is_ipv4() { 32 } else { 128 };
    let bits = match bits {
        Some(b) => {
            b.parse::<u8>().ok().filter(|b| *b <= max).ok_or_else(|| bad(&format!("bits are 0 to {max}")))?
        }
        None => max,
    };
    Ok((address, bits))
}

fn contains(net: IpAddr, bits: u8, ip: IpAddr) -> bool {
    match (net, ip) {
        (IpAddr::V4(n), IpAddr::V4(i)) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(bits)).unwrap_or(0);
            u32::from(n) & mask == u32::from(i) & mask
        }
        (IpAddr::V6(n), IpAddr::V6(i)) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(bits)).unwrap_or(0);
            u128::from(n) & mask == u128::from(i) & mask
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(policy: &Outbound, ip: &str) -> bool {
        policy.check(ip.parse().unwrap()).is_err()
    }

    #[test]
    fn loopback_unspecified_and_link_local_are_refused_in_every_form() {
        let policy = Outbound::default();
        for ip in [
            "127.0.0.1",
            "127.1.2.3",
            "0.0.0.0",
            "0.1.2.3",
            "169.254.169.254",
            "255.255.255.255",
            "224.0.0.1",
            "::1",
            "::",
            "fe80::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::ffff:0.0.0.0",
            "::127.0.0.1",
            "::169.254.169.254",
            "64:ff9b::7f00:1",
            "64:ff9b::a9fe:a9fe",
        ] {
            assert!(refused(&policy, ip), "{ip} let through");
        }
        for ip in ["10.0.0.5", "192.168.1.1", "172.16.0.1", "8.8.8.8", "2001:db8::1", "::ffff:10.0.0.5"] {
            assert!(!refused(&policy, ip), "{ip} refused");
        }
        let e = policy.check("::ffff:169.254.169.254".parse().unwrap()).unwrap_err();
        assert!(matches!(e, Refused::Class { .. }), "{e:?}");
        assert!(e.to_string().contains("169.254.169.254 is a link-local address"), "{e}");
    }

    #[test]
    fn an_operator_allows_ranges_and_the_servers_own_address_is_refused() {
        let policy = Outbound::new(&["127.0.0.0/8".into(), "::1".into()]).unwrap();
        assert!(
            !refused(&policy, "127.0.0.1")
                && !refused(&policy, "::ffff:127.0.0.1")
                && !refused(&policy, "::1")
        );
        assert!(refused(&policy, "169.254.169.254"));
        let own = Outbound::default().with_own("10.1.2.3".parse().unwrap());
        assert!(refused(&own, "10.1.2.3") && !refused(&own, "10.1.2.4"));
        for bad in ["x", "10.0.0.0/33", "::/129", "10.0.0.0/-1"] {
            assert!(
                Outbound::new(&[bad.into()]).unwrap_err().to_string().contains("--outbound-allow"),
                "{bad}"
            );
        }
        assert!(Outbound::new(&["0.0.0.0/0".into()]).unwrap().check("127.0.0.1".parse().unwrap()).is_ok());
    }

    #[tokio::test]
    async fn a_name_that_resolves_to_loopback_is_refused_as_it_is_resolved() {
        use reqwest::dns::Resolve;
        let name = || "localhost".parse::<reqwest::dns::Name>().unwrap();
        let e = Outbound::default().resolve(name()).await.err().expect("refused");
        assert!(e.to_string().contains("loopback"), "{e}");
        let allowed = Outbound::with_loopback().resolve(name()).await.unwrap();
        assert!(allowed.count() > 0);
    }

    proptest::proptest! {
        /// Any address in any form: checked without panicking, and an
        /// IPv4-mapped address is judged as its IPv4 address.
        #[test]
        fn every_address_is_judged_as_its_canonical_form(v4 in proptest::prelude::any::<u32>(), bits in 0u8..=40) {
            let policy = Outbound::default();
            let ip = Ipv4Addr::from(v4);
            let mapped = IpAddr::V6(ip.to_ipv6_mapped());
            proptest::prop_assert_eq!(policy.check(IpAddr::V4(ip)).is_ok(), policy.check(mapped).is_ok());
            let _ = Outbound::new(&[format!("{ip}/{bits}")]);
        }
    }
}
