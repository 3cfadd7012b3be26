//! The one policy for requests the master makes on a principal's behalf (http transitions; later
//! the http binding, OpenAPI fetches, MCP servers): the address a request connects to is checked,
//! and loopback, unspecified, link-local, cloud metadata and the master's own address are refused
//! unless `--http-allow` names them.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;
use std::sync::Arc;

/// Redirects followed at most, as reqwest's own default.
const MAX_REDIRECTS: usize = 10;

/// One address or a CIDR block, as `--http-allow` takes it (`127.0.0.1`, `10.0.0.0/8`, `::1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpRange {
    /// The network address: the bits past `prefix` are zero.
    addr: IpAddr,
    prefix: u8,
}

impl IpRange {
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => mask_v4(ip, self.prefix) == net,
            (IpAddr::V6(net), IpAddr::V6(ip)) => mask_v6(ip, self.prefix) == net,
            _ => false,
        }
    }
}

fn mask_v4(ip: Ipv4Addr, prefix: u8) -> Ipv4Addr {
    let bits = u32::from(ip);
    Ipv4Addr::from(if prefix == 0 { 0 } else { bits & (u32::MAX << (32 - u32::from(prefix))) })
}

fn mask_v6(ip: Ipv6Addr, prefix: u8) -> Ipv6Addr {
    let bits = u128::from(ip);
    Ipv6Addr::from(if prefix == 0 { 0 } else { bits & (u128::MAX << (128 - u32::from(prefix))) })
}

impl FromStr for IpRange {
    type Err = OutboundError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let invalid = || OutboundError::InvalidRange(s.to_string());
        let (ip, prefix) = match s.trim().split_once('/') {
            Some((ip, p)) => (ip, Some(p.parse::<u8>().map_err(|_| invalid())?)),
            None => (s.trim(), None),
        };
        let ip: IpAddr = ip.parse().map_err(|_| invalid())?;
        let max = if ip.is_ipv4() { 32 } else { 128 };
        let prefix = prefix.unwrap_or(max);
        if prefix > max {
            return Err(invalid());
        }
        let addr = match ip {
            IpAddr::V4(v4) => IpAddr::V4(mask_v4(v4, prefix)),
            IpAddr::V6(v6) => IpAddr::V6(mask_v6(v6, prefix)),
        };
        Ok(IpRange { addr, prefix })
    }
}

impl fmt::Display for IpRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum OutboundError {
    #[error("{0:?} is neither an IP address nor a CIDR block (e.g. 127.0.0.1, 10.0.0.0/8, ::1)")]
    InvalidRange(String),
    #[error("{addr} is refused: it is {what}; start the master with --http-allow {addr} to allow it")]
    Refused { addr: IpAddr, what: &'static str },
    #[error("{host} resolves only to refused addresses ({}); start the master with --http-allow {} to allow it",
        .refused.iter().map(|(a, what)| format!("{a}: {what}")).collect::<Vec<_>>().join(", "),
        .refused.first().map(|(a, _)| a.to_string()).unwrap_or_default())]
    RefusedName { host: String, refused: Vec<(IpAddr, &'static str)> },
    #[error("{0} resolves to no address")]
    NoAddress(String),
    #[error("more than {MAX_REDIRECTS} redirects")]
    TooManyRedirects,
    #[error("building the http client: {0}")]
    Client(#[source] reqwest::Error),
}

/// Which addresses requests may connect to. Cheap to clone; the client it builds shares it.
#[derive(Debug, Clone, Default)]
pub struct OutboundPolicy {
    rules: Arc<Rules>,
}

#[derive(Debug, Default)]
struct Rules {
    allow: Vec<IpRange>,
    /// The master's own addresses: the one it listens on, or when it listens on all (`0.0.0.0`,
    /// `::`) every address of the machine's interfaces, each of which reaches its API.
    own: Vec<IpAddr>,
    deny_private: bool,
}

impl OutboundPolicy {
    /// A policy that refuses the usual addresses except those in `allow`.
    pub fn new(allow: Vec<IpRange>) -> OutboundPolicy {
        OutboundPolicy { rules: Arc::new(Rules { allow, own: Vec::new(), deny_private: false }) }
    }

    /// Also refuses the address the master listens on (its API is not a target for its own
    /// requests). Only the IP counts: the resolver never learns the port a request is for. A
    /// master listening on all addresses is reached on each of the machine's interface addresses
    /// (read now, at start), so all of them are refused.
    pub fn listening_on(self, addr: SocketAddr) -> OutboundPolicy {
        let ip = addr.ip().to_canonical();
        let own = if ip.is_unspecified() {
            // `0.0.0.0` answers on IPv4 addresses only; `::` on both.
            interface_addresses().into_iter().filter(|a| ip.is_ipv6() || a.is_ipv4()).collect()
        } else {
            vec![ip]
        };
        self.own_addresses(own)
    }

    /// Refuses these addresses as the master's own (see [`OutboundPolicy::listening_on`]).
    pub fn own_addresses(self, own: Vec<IpAddr>) -> OutboundPolicy {
        let own = own.into_iter().map(|ip| ip.to_canonical()).collect();
        OutboundPolicy { rules: Arc::new(Rules { own, ..self.rules.cloned() }) }
    }

    /// Also refuses private ranges (10/8, 172.16/12, 192.168/16, fc00::/7).
    pub fn deny_private(self, deny: bool) -> OutboundPolicy {
        OutboundPolicy { rules: Arc::new(Rules { deny_private: deny, ..self.rules.cloned() }) }
    }

    /// Whether a request may connect to `ip`.
    pub fn check_ip(&self, ip: IpAddr) -> Result<(), OutboundError> {
        self.rules.check_ip(ip)
    }

    /// Checks a URL whose host is an IP literal: reqwest connects to those without asking the
    /// resolver, so every caller checks before sending. Names are checked when resolved.
    pub fn check_url(&self, url: &reqwest::Url) -> Result<(), OutboundError> {
        self.rules.check_url(url)
    }

    /// The client every outbound request goes through: names resolve through the policy,
    /// redirects to refused IP literals are not followed, and no proxy is used (a proxy resolves
    /// names itself, where the policy cannot see them).
    pub fn client(&self) -> Result<reqwest::Client, OutboundError> {
        self.build(false)
    }

    /// The client for requests that carry a secret: as [`OutboundPolicy::client`], but a
    /// redirect to another origin is not followed (its 3xx is the answer), so a secret granted
    /// to one origin never reaches another.
    pub fn sealed_client(&self) -> Result<reqwest::Client, OutboundError> {
        self.build(true)
    }

    fn build(&self, same_origin: bool) -> Result<reqwest::Client, OutboundError> {
        let rules = self.rules.clone();
        let redirects = reqwest::redirect::Policy::custom(move |attempt| {
            // The first of `previous` is the original request, not a redirect.
            if attempt.previous().len() > MAX_REDIRECTS {
                return attempt.error(OutboundError::TooManyRedirects);
            }
            if same_origin && attempt.previous().first().map(|u| u.origin()) != Some(attempt.url().origin()) {
                return attempt.stop();
            }
            match rules.check_url(attempt.url()) {
                Ok(()) => attempt.follow(),
                Err(e) => attempt.error(e),
            }
        });
        reqwest::Client::builder()
            .dns_resolver(Resolver { rules: self.rules.clone() })
            .redirect(redirects)
            .no_proxy()
            .build()
            .map_err(OutboundError::Client)
    }
}

impl Rules {
    fn cloned(&self) -> Rules {
        Rules { allow: self.allow.clone(), own: self.own.clone(), deny_private: self.deny_private }
    }

    fn check_ip(&self, ip: IpAddr) -> Result<(), OutboundError> {
        let canonical = ip.to_canonical();
        if self.allow.iter().any(|r| r.contains(ip) || r.contains(canonical)) {
            return Ok(());
        }
        let what = refused_kind(canonical, self.deny_private)
            .or_else(|| self.own.contains(&canonical).then_some("this master's own address"));
        match what {
            Some(what) => Err(OutboundError::Refused { addr: ip, what }),
            None => Ok(()),
        }
    }

    fn check_url(&self, url: &reqwest::Url) -> Result<(), OutboundError> {
        // The URL parser has already normalised IPv4 spellings (`2130706433`, `127.1`) to dotted
        // quads; IPv6 literals come in brackets.
        let Some(host) = url.host_str() else { return Ok(()) };
        match host.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>() {
            Ok(ip) => self.check_ip(ip),
            Err(_) => Ok(()),
        }
    }
}

const METADATA_V4: [Ipv4Addr; 2] = [Ipv4Addr::new(169, 254, 169, 254), Ipv4Addr::new(100, 100, 100, 200)];
const METADATA_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254);

/// Why an address (IPv4-mapped forms already unwrapped) is refused by default, if it is.
fn refused_kind(ip: IpAddr, deny_private: bool) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => {
            if METADATA_V4.contains(&v4) {
                Some("a cloud metadata address")
            } else if v4.is_loopback() {
                Some("a loopback address")
            } else if v4.octets()[0] == 0 {
                // 0.0.0.0/8: "this network"; connecting to 0.0.0.0 reaches the local host.
                Some("an unspecified address")
            } else if v4.is_link_local() {
                Some("a link-local address")
            } else if deny_private && v4.is_private() {
                Some("a private address (--http-deny-private)")
            } else {
                None
            }
        }
        IpAddr::V6(v6) => {
            let first = v6.segments()[0];
            if v6 == METADATA_V6 {
                Some("a cloud metadata address")
            } else if v6.is_loopback() {
                Some("a loopback address")
            } else if v6.is_unspecified() {
                Some("an unspecified address")
            } else if first & 0xffc0 == 0xfe80 {
                Some("a link-local address")
            } else if deny_private && first & 0xfe00 == 0xfc00 {
                Some("a private address (--http-deny-private)")
            } else {
                None
            }
        }
    }
}

/// The addresses of this machine's network interfaces (none when they cannot be read).
pub fn interface_addresses() -> Vec<IpAddr> {
    let mut out = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list this function frees below, and nothing else.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        tracing::warn!(error = %std::io::Error::last_os_error(), "could not read the interface addresses; only loopback is known as this master's own");
        return out;
    }
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, not yet freed.
        let ifa = unsafe { &*cur };
        if !ifa.ifa_addr.is_null() {
            // SAFETY: `ifa_addr` points at a sockaddr whose family says which struct it is.
            match i32::from(unsafe { (*ifa.ifa_addr).sa_family }) {
                libc::AF_INET => {
                    // SAFETY: an AF_INET address is a sockaddr_in.
                    let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                    out.push(IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr))));
                }
                libc::AF_INET6 => {
                    // SAFETY: an AF_INET6 address is a sockaddr_in6.
                    let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
                    out.push(IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr)));
                }
                _ => {}
            }
        }
        cur = ifa.ifa_next;
    }
    // SAFETY: `head` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    out
}

/// Resolves names with the system resolver and keeps only the addresses the policy allows; a
/// name with none left fails, naming what it resolved to.
struct Resolver {
    rules: Arc<Rules>,
}

impl reqwest::dns::Resolve for Resolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let rules = self.rules.clone();
        let host = name.as_str().to_string();
        Box::pin(async move {
            let found = tokio::net::lookup_host((host.as_str(), 0)).await?;
            let mut refused = Vec::new();
            let mut kept: Vec<SocketAddr> = Vec::new();
            for addr in found {
                match rules.check_ip(addr.ip()) {
                    Ok(()) => kept.push(addr),
                    Err(OutboundError::Refused { addr, what }) => refused.push((addr, what)),
                    Err(other) => return Err(other.into()),
                }
            }
            if kept.is_empty() {
                let e = if refused.is_empty() {
                    OutboundError::NoAddress(host)
                } else {
                    OutboundError::RefusedName { host, refused }
                };
                return Err(e.into());
            }
            Ok(Box::new(kept.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// A failed request with every cause, outermost first: reqwest's own message names only the
/// kind of failure, and the refusal that explains it sits at the bottom of the chain.
pub fn describe(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

/// The origin of a URL, in the form grants hold: scheme, lower-case host, and the port when it is not the default.
pub fn origin_of(url: &reqwest::Url) -> Option<String> {
    let host = url.host_str()?.to_lowercase();
    Some(match url.port() {
        Some(port) => format!("{}://{host}:{port}", url.scheme()),
        None => format!("{}://{host}", url.scheme()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Checks `addr` against a policy allowing `allow` (own address 192.168.1.5:7420):
    /// `expected` is `None` when it is allowed, else the words that say why it is refused.
    fn check(addr: &str, allow: &[&str], expected: Option<&str>) {
        let allow = allow.iter().map(|a| a.parse().unwrap()).collect();
        let policy = OutboundPolicy::new(allow).listening_on("192.168.1.5:7420".parse().unwrap());
        let ip: IpAddr = addr.parse().unwrap();
        match (policy.check_ip(ip), expected) {
            (Ok(()), None) => {}
            (Err(OutboundError::Refused { what, .. }), Some(want)) => assert!(what.contains(want), "{addr}: {what}"),
            (got, want) => panic!(
                "{addr} with allow {allow_shown:?}: got {got:?}, want {want:?}",
                allow_shown = policy.rules.allow
            ),
        }
        // A URL with the address as its host is judged the same.
        let host = if ip.is_ipv6() { format!("[{ip}]") } else { ip.to_string() };
        let url = reqwest::Url::parse(&format!("http://{host}:8080/x")).unwrap();
        assert_eq!(policy.check_url(&url).is_ok(), expected.is_none(), "url {url}");
    }

    #[test]
    fn addresses_are_classified() {
        let cases: &[(&str, &[&str], Option<&str>)] = &[
            ("127.0.0.1", &[], Some("loopback")),
            ("127.8.9.10", &[], Some("loopback")),
            ("::1", &[], Some("loopback")),
            ("0.0.0.0", &[], Some("unspecified")),
            ("::", &[], Some("unspecified")),
            ("169.254.1.1", &[], Some("link-local")),
            ("fe80::1", &[], Some("link-local")),
            ("febf::1", &[], Some("link-local")),
            ("169.254.169.254", &[], Some("metadata")),
            ("fd00:ec2::254", &[], Some("metadata")),
            ("100.100.100.200", &[], Some("metadata")),
            ("::ffff:127.0.0.1", &[], Some("loopback")),
            ("::ffff:169.254.169.254", &[], Some("metadata")),
            ("192.168.1.5", &[], Some("own address")),
            // Private ranges and public addresses are allowed by default.
            ("10.1.2.3", &[], None),
            ("172.16.0.1", &[], None),
            ("192.168.1.6", &[], None),
            ("fd12::1", &[], None),
            ("93.184.216.34", &[], None),
            ("2606:4700::1111", &[], None),
            ("100.64.0.1", &[], None),
            // `--http-allow` names an address or a block, in either spelling of a mapped address.
            ("127.0.0.1", &["127.0.0.1"], None),
            ("127.0.0.2", &["127.0.0.1"], Some("loopback")),
            ("127.0.0.2", &["127.0.0.0/8"], None),
            ("::ffff:127.0.0.1", &["127.0.0.1"], None),
            ("::1", &["::1"], None),
            ("::1", &["127.0.0.1"], Some("loopback")),
            ("169.254.169.254", &["169.254.0.0/16"], None),
            ("192.168.1.5", &["192.168.1.5"], None),
            ("0.0.0.0", &["0.0.0.0/0"], None),
        ];
        for (addr, allow, expected) in cases {
            check(addr, allow, *expected);
        }
    }

    #[test]
    fn a_master_listening_on_all_addresses_refuses_each_interface_address() {
        let interfaces = interface_addresses();
        assert!(interfaces.contains(&IpAddr::V4(Ipv4Addr::LOCALHOST)), "{interfaces:?}");
        let policy = OutboundPolicy::new(Vec::new()).listening_on("0.0.0.0:7420".parse().unwrap());
        for ip in interfaces.iter().filter(|ip| ip.is_ipv4()) {
            assert!(policy.check_ip(*ip).is_err(), "{ip} is this master's own");
        }
        // Named by --http-allow, an own address is reached like any other.
        let own: IpAddr = "192.0.2.7".parse().unwrap();
        let policy = OutboundPolicy::new(Vec::new()).own_addresses(vec![own]);
        let e = policy.check_ip(own).unwrap_err().to_string();
        assert!(e.contains("own address") && e.contains("--http-allow 192.0.2.7"), "{e}");
        let policy = OutboundPolicy::new(vec!["192.0.2.7".parse().unwrap()]).own_addresses(vec![own]);
        assert!(policy.check_ip(own).is_ok());
        assert!(policy.check_ip("192.0.2.8".parse().unwrap()).is_ok());
    }

    #[test]
    fn private_ranges_are_refused_when_asked() {
        let policy = OutboundPolicy::new(vec!["10.9.0.0/16".parse().unwrap()]).deny_private(true);
        for (addr, refused) in
            [("10.1.2.3", true), ("10.9.1.1", false), ("172.31.0.1", true), ("192.168.0.1", true), ("fc00::1", true)]
        {
            assert_eq!(policy.check_ip(addr.parse().unwrap()).is_err(), refused, "{addr}");
        }
    }

    #[test]
    fn ranges_parse_or_are_refused() {
        for (text, shown) in [
            ("127.0.0.1", Some("127.0.0.1/32")),
            ("10.1.2.3/8", Some("10.0.0.0/8")),
            ("::1", Some("::1/128")),
            ("fe80::1/10", Some("fe80::/10")),
            ("0.0.0.0/0", Some("0.0.0.0/0")),
            ("10.0.0.0/33", None),
            ("localhost", None),
            ("10.0.0.0/x", None),
            ("", None),
        ] {
            assert_eq!(text.parse::<IpRange>().ok().map(|r| r.to_string()).as_deref(), shown, "{text:?}");
        }
    }

    #[test]
    fn a_refusal_names_the_address_and_the_flag() {
        let e = OutboundPolicy::default().check_ip("127.0.0.1".parse().unwrap()).unwrap_err().to_string();
        assert!(e.contains("127.0.0.1") && e.contains("--http-allow 127.0.0.1"), "{e}");
        let e = OutboundError::RefusedName {
            host: "localhost".into(),
            refused: vec![
                ("::1".parse().unwrap(), "a loopback address"),
                ("127.0.0.1".parse().unwrap(), "a loopback address"),
            ],
        }
        .to_string();
        assert!(
            e.contains("localhost") && e.contains("127.0.0.1: a loopback") && e.contains("--http-allow ::1"),
            "{e}"
        );
    }
}
