//! The one policy for requests the master makes on a principal's behalf (http transitions, the
//! http binding, OpenAPI fetches, MCP servers): the address a request connects to is checked,
//! and loopback, unspecified, link-local, multicast, cloud metadata and the master's own address
//! are refused unless `--http-allow` names them.

use std::cell::Cell;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;
use std::sync::Arc;

/// Redirects followed at most, as reqwest's own default.
const MAX_REDIRECTS: usize = 10;

tokio::task_local! {
    /// The port the request being sent goes to ([`sending`]), for the resolver, which is handed
    /// a name alone; the redirect policy sets it to each redirect's.
    static PORT: Cell<Option<u16>>;
}

/// Sends a request (`send`, its `send()` future) to `url` with its port known to the policy's
/// resolver: a name is then judged with its port as an IP literal is, so an `--http-allow`
/// entry with a port applies to it and the master's own address is refused on its own port.
pub async fn sending<F: std::future::Future>(url: &reqwest::Url, send: F) -> F::Output {
    PORT.scope(Cell::new(url.port_or_known_default()), send).await
}

/// One address or a CIDR block, and maybe one port, as `--http-allow` takes it (`127.0.0.1`,
/// `10.0.0.0/8`, `::1`, `127.0.0.1:8080`, `[::1]:8080`, `10.0.0.0/8:443`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpRange {
    /// The network address: the bits past `prefix` are zero.
    addr: IpAddr,
    prefix: u8,
    /// The one port it opens; every port when `None`.
    port: Option<u16>,
}

impl IpRange {
    /// Whether `ip` is in the range, and `port` (when known) is the one it names, if it names
    /// one. An entry with a port never opens a request whose port is not known.
    pub fn contains(&self, ip: IpAddr, port: Option<u16>) -> bool {
        let in_block = match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => mask_v4(ip, self.prefix) == net,
            (IpAddr::V6(net), IpAddr::V6(ip)) => mask_v6(ip, self.prefix) == net,
            _ => false,
        };
        in_block && (self.port.is_none() || self.port == port)
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
        let text = s.trim();
        let port = |p: &str| p.parse::<u16>().ok().filter(|p| *p != 0).ok_or_else(invalid);
        // `[v6]:port`, `v4:port` (one colon), or no port (an IPv6 address has several colons).
        let (block, port) = if let Some(rest) = text.strip_prefix('[') {
            let (inside, after) = rest.split_once(']').ok_or_else(invalid)?;
            let after = after.strip_prefix(':').ok_or_else(invalid)?;
            (inside, Some(port(after)?))
        } else if text.matches(':').count() == 1 {
            let (block, after) = text.split_once(':').ok_or_else(invalid)?;
            (block, Some(port(after)?))
        } else {
            (text, None)
        };
        let (ip, prefix) = match block.split_once('/') {
            Some((ip, p)) => (ip, Some(p.parse::<u8>().map_err(|_| invalid())?)),
            None => (block, None),
        };
        let ip: IpAddr = ip.parse().map_err(|_| invalid())?;
        if ip.is_ipv6() && port.is_some() && !text.starts_with('[') {
            return Err(invalid());
        }
        let max = if ip.is_ipv4() { 32 } else { 128 };
        let prefix = prefix.unwrap_or(max);
        if prefix > max {
            return Err(invalid());
        }
        let addr = match ip {
            IpAddr::V4(v4) => IpAddr::V4(mask_v4(v4, prefix)),
            IpAddr::V6(v6) => IpAddr::V6(mask_v6(v6, prefix)),
        };
        Ok(IpRange { addr, prefix, port })
    }
}

impl fmt::Display for IpRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.port, self.addr) {
            (None, _) => write!(f, "{}/{}", self.addr, self.prefix),
            (Some(port), IpAddr::V4(_)) => write!(f, "{}/{}:{port}", self.addr, self.prefix),
            (Some(port), IpAddr::V6(_)) => write!(f, "[{}/{}]:{port}", self.addr, self.prefix),
        }
    }
}

/// What `--http-allow` takes to open `ip`, on `port` when given.
fn allow_hint(ip: IpAddr, port: Option<u16>) -> String {
    match (port, ip) {
        (None, _) => ip.to_string(),
        (Some(port), IpAddr::V4(_)) => format!("{ip}:{port}"),
        (Some(port), IpAddr::V6(_)) => format!("[{ip}]:{port}"),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum OutboundError {
    #[error(
        "{0:?} is neither an IP address nor a CIDR block, with or without a port (e.g. 127.0.0.1, 10.0.0.0/8, ::1, 127.0.0.1:8080, [::1]:8080)"
    )]
    InvalidRange(String),
    #[error("{addr} is refused: it is {what}; start the master with --http-allow {allow} to allow it")]
    Refused { addr: IpAddr, what: &'static str, allow: String },
    #[error("{host} resolves only to refused addresses ({}); start the master with --http-allow {allow} to allow it",
        .refused.iter().map(|(a, what)| format!("{a}: {what}")).collect::<Vec<_>>().join(", "))]
    RefusedName { host: String, refused: Vec<(IpAddr, &'static str)>, allow: String },
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
    /// The port it listens on; every port of `own` is its own when `None`.
    own_port: Option<u16>,
    deny_private: bool,
}

impl OutboundPolicy {
    /// A policy that refuses the usual addresses except those in `allow`.
    pub fn new(allow: Vec<IpRange>) -> OutboundPolicy {
        OutboundPolicy { rules: Arc::new(Rules { allow, own: Vec::new(), own_port: None, deny_private: false }) }
    }

    /// Also refuses the address the master listens on (its API is not a target for its own
    /// requests), on its port even when `--http-allow` opens the IP: only an entry naming the
    /// port opens it. A request whose port the resolver is not told ([`sending`]) is judged by
    /// the IP alone. A master listening on all addresses is reached on each of the machine's
    /// interface addresses (read now, at start), so all of them are refused.
    pub fn listening_on(self, addr: SocketAddr) -> OutboundPolicy {
        let ip = addr.ip().to_canonical();
        let own = if ip.is_unspecified() {
            // `0.0.0.0` answers on IPv4 addresses only; `::` on both.
            interface_addresses().into_iter().filter(|a| ip.is_ipv6() || a.is_ipv4()).collect()
        } else {
            vec![ip]
        };
        let policy = self.own_addresses(own);
        OutboundPolicy { rules: Arc::new(Rules { own_port: Some(addr.port()), ..policy.rules.cloned() }) }
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

    /// Whether a request may connect to `ip`, on `port` when known.
    pub fn check_ip(&self, ip: IpAddr, port: Option<u16>) -> Result<(), OutboundError> {
        self.rules.check_ip(ip, port)
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
            // The redirect's own port, for the resolver when its host is a name.
            let _ = PORT.try_with(|port| port.set(attempt.url().port_or_known_default()));
            match rules.check_url(attempt.url()) {
                Ok(()) => attempt.follow(),
                Err(e) => attempt.error(e),
            }
        });
        reqwest::Client::builder()
            .dns_resolver(Resolver { rules: self.rules.clone() })
            .redirect(redirects)
            // A redirect to another origin would tell it the URL the request was for.
            .referer(false)
            // Some services refuse a request that names no client (GitHub's API, for one).
            .user_agent(concat!("agentos/", env!("CARGO_PKG_VERSION")))
            .no_proxy()
            .build()
            .map_err(OutboundError::Client)
    }
}

impl Rules {
    fn cloned(&self) -> Rules {
        Rules {
            allow: self.allow.clone(),
            own: self.own.clone(),
            own_port: self.own_port,
            deny_private: self.deny_private,
        }
    }

    fn check_ip(&self, ip: IpAddr, port: Option<u16>) -> Result<(), OutboundError> {
        // The address as written, without its IPv4-mapped wrapping, and the IPv4 address another
        // IPv6 form carries (NAT64, 6to4, Teredo, IPv4-compatible), which it may reach.
        let canonical = ip.to_canonical();
        let embedded = match canonical {
            IpAddr::V6(v6) => embedded_v4(v6).map(IpAddr::V4),
            IpAddr::V4(_) => None,
        };
        let forms: Vec<IpAddr> = [Some(ip), Some(canonical), embedded].into_iter().flatten().collect();
        let allowed = |port_named: bool| {
            self.allow.iter().any(|r| (!port_named || r.port.is_some()) && forms.iter().any(|f| r.contains(*f, port)))
        };
        // The master's own addresses reach whatever listens on the machine, on every port. On the
        // master's own port only an entry naming that port opens one: an entry that opens the
        // IP leaves it refused, so opening a service beside the master does not open the master.
        // On that port an unspecified address (`0.0.0.0`, `::`) is one of them: a connection to
        // it reaches this machine, the master included.
        let on_own_port = port.is_none_or(|p| self.own_port.is_none_or(|own| own == p));
        let unspecified_to_own = !self.own.is_empty() && on_own_port;
        if forms.iter().any(|f| self.own.contains(f) || (unspecified_to_own && f.is_unspecified())) {
            let own_port = matches!((port, self.own_port), (Some(p), Some(own)) if p == own);
            if allowed(own_port) {
                return Ok(());
            }
            // The hint names the port asked for: an entry for the whole address would open every
            // service on the machine (and on its own port the master is refused anyway).
            let what = match (own_port, canonical.is_loopback()) {
                (true, _) => "this master's own address and port",
                (false, true) => "a loopback address (the machine this master runs on)",
                (false, false) => "this master's own address",
            };
            return Err(OutboundError::Refused { addr: ip, what, allow: allow_hint(canonical, port) });
        }
        if allowed(false) {
            return Ok(());
        }
        match forms.iter().find_map(|f| refused_kind(*f, self.deny_private)) {
            Some(what) => Err(OutboundError::Refused { addr: ip, what, allow: allow_hint(canonical, port) }),
            None => Ok(()),
        }
    }

    fn check_url(&self, url: &reqwest::Url) -> Result<(), OutboundError> {
        // The URL parser has already normalised IPv4 spellings (`2130706433`, `127.1`) to dotted
        // quads; IPv6 literals come in brackets.
        let Some(host) = url.host_str() else { return Ok(()) };
        match host.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>() {
            Ok(ip) => self.check_ip(ip, url.port_or_known_default()),
            Err(_) => Ok(()),
        }
    }
}

const METADATA_V4: [Ipv4Addr; 3] = [
    Ipv4Addr::new(169, 254, 169, 254),
    Ipv4Addr::new(100, 100, 100, 200),
    // Azure's wire server, which hands out a VM's certificates and settings.
    Ipv4Addr::new(168, 63, 129, 16),
];
const METADATA_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254);

/// The IPv4 address an IPv6 one carries and may reach through a translator or a tunnel:
/// IPv4-compatible (`::a.b.c.d`), SIIT (`::ffff:0:a.b.c.d`), NAT64 (`64:ff9b::/96` and the
/// local-use `64:ff9b:1::/48`), 6to4 (`2002:AABB:CCDD::/48`) and Teredo (`2001::/32`, the client's
/// address inverted in the last 32 bits). IPv4-mapped ones are `to_canonical`'s.
fn embedded_v4(v6: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = v6.segments();
    let v4 = |hi: u16, lo: u16| Some(Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo)));
    match s {
        [0, 0, 0, 0, 0, 0, hi, lo] if v6 != Ipv6Addr::UNSPECIFIED && v6 != Ipv6Addr::LOCALHOST => v4(hi, lo),
        [0, 0, 0, 0, 0xffff, 0, hi, lo] => v4(hi, lo),
        [0x64, 0xff9b, 0, 0, 0, 0, hi, lo] | [0x64, 0xff9b, 1, _, _, _, hi, lo] => v4(hi, lo),
        [0x2002, hi, lo, ..] => v4(hi, lo),
        [0x2001, 0, _, _, _, _, hi, lo] => v4(!hi, !lo),
        _ => None,
    }
}

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
            } else if v4.is_multicast() || v4.octets()[0] >= 240 {
                // 224/4 multicast, 240/4 reserved, 255.255.255.255 broadcast: no one service.
                Some("a multicast, broadcast or reserved address")
            } else if deny_private && (v4.is_private() || is_shared_v4(v4)) {
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
            } else if first & 0xff00 == 0xff00 {
                Some("a multicast, broadcast or reserved address")
            } else if deny_private && first & 0xfe00 == 0xfc00 {
                Some("a private address (--http-deny-private)")
            } else {
                None
            }
        }
    }
}

/// 100.64/10, the carrier-grade NAT block: a provider's private network.
fn is_shared_v4(v4: Ipv4Addr) -> bool {
    let [a, b, ..] = v4.octets();
    a == 100 && b & 0xc0 == 64
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
        // Called as the connection starts, inside the send that [`sending`] scoped, if it was.
        let port = PORT.try_with(Cell::get).ok().flatten();
        Box::pin(async move {
            let found = tokio::net::lookup_host((host.as_str(), 0)).await?;
            let mut refused = Vec::new();
            let mut allow = None;
            let mut kept: Vec<SocketAddr> = Vec::new();
            for addr in found {
                match rules.check_ip(addr.ip(), port) {
                    Ok(()) => kept.push(addr),
                    Err(OutboundError::Refused { addr, what, allow: hint }) => {
                        allow.get_or_insert(hint);
                        refused.push((addr, what));
                    }
                    Err(other) => return Err(other.into()),
                }
            }
            if kept.is_empty() {
                let e = match allow {
                    None => OutboundError::NoAddress(host),
                    Some(allow) => OutboundError::RefusedName { host, refused, allow },
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
    // The request's URL, which every message this goes into names already (and which may be
    // long): "error sending request for url (…)" is "error sending request".
    if let Some(url) = e.downcast_ref::<reqwest::Error>().and_then(reqwest::Error::url) {
        out = out.replacen(&format!(" for url ({url})"), "", 1);
    }
    for s in sources(e).skip(1) {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
    }
    out
}

/// Whether a request failed because nothing listened at the address (the connection was
/// refused): the service is down or restarting, which passes with time, unlike a request the
/// policy refused, one cut off later (a reset in a TLS handshake, or after the request went
/// out, which a service may have acted on), or one the service answered.
pub fn service_down(e: &reqwest::Error) -> bool {
    e.is_connect()
        && sources(e).any(|s| {
            s.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused)
        })
}

/// The policy's refusal a request failed with, when the name it was sent to resolved only to
/// refused addresses: the same refusal as for an address given as such.
pub fn refusal_of(e: &reqwest::Error) -> Option<&OutboundError> {
    sources(e).find_map(|s| {
        s.downcast_ref::<OutboundError>()
            .filter(|o| matches!(o, OutboundError::Refused { .. } | OutboundError::RefusedName { .. }))
    })
}

/// An error and every error under it.
fn sources<'a>(
    e: &'a (dyn std::error::Error + 'static),
) -> impl Iterator<Item = &'a (dyn std::error::Error + 'static)> {
    std::iter::successors(Some(e), |s| s.source())
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

    /// Checks `addr` on port 8080 against a policy allowing `allow` (own address
    /// 192.168.1.5:7420): `expected` is `None` when it is allowed, else the words that say why it
    /// is refused.
    fn check(addr: &str, allow: &[&str], expected: Option<&str>) {
        check_on(addr, 8080, allow, expected)
    }

    fn check_on(addr: &str, port: u16, allow: &[&str], expected: Option<&str>) {
        let allow = allow.iter().map(|a| a.parse().unwrap()).collect();
        let policy = OutboundPolicy::new(allow).listening_on("192.168.1.5:7420".parse().unwrap());
        let ip: IpAddr = addr.parse().unwrap();
        match (policy.check_ip(ip, Some(port)), expected) {
            (Ok(()), None) => {}
            (Err(OutboundError::Refused { what, .. }), Some(want)) => assert!(what.contains(want), "{addr}: {what}"),
            (got, want) => panic!(
                "{addr} with allow {allow_shown:?}: got {got:?}, want {want:?}",
                allow_shown = policy.rules.allow
            ),
        }
        // A URL with the address as its host is judged the same.
        let host = if ip.is_ipv6() { format!("[{ip}]") } else { ip.to_string() };
        let url = reqwest::Url::parse(&format!("http://{host}:{port}/x")).unwrap();
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
            // IPv6 forms that carry an IPv4 address are judged by it too.
            ("::127.0.0.1", &[], Some("loopback")),
            ("::ffff:0:7f00:1", &[], Some("loopback")),
            ("64:ff9b::7f00:1", &[], Some("loopback")),
            ("64:ff9b::a9fe:a9fe", &[], Some("metadata")),
            ("64:ff9b:1::a9fe:a9fe", &[], Some("metadata")),
            ("2002:7f00:1::", &[], Some("loopback")),
            ("2001:0:4136:e378:8000:63bf:80ff:fffe", &[], Some("loopback")),
            ("64:ff9b::5db8:d822", &[], None),
            ("2002:5db8:d822::1", &[], None),
            // Multicast, broadcast and reserved addresses reach no one service.
            ("224.0.0.1", &[], Some("multicast")),
            ("239.255.255.250", &[], Some("multicast")),
            ("255.255.255.255", &[], Some("broadcast")),
            ("240.0.0.1", &[], Some("reserved")),
            ("ff02::1", &[], Some("multicast")),
            ("168.63.129.16", &[], Some("metadata")),
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
            ("0.0.0.0", &["0.0.0.0/0"], None),
            ("64:ff9b::7f00:1", &["127.0.0.1"], None),
            // With a port, an entry opens that port alone.
            ("127.0.0.1", &["127.0.0.1:8080"], None),
            ("127.0.0.1", &["127.0.0.1:8081"], Some("loopback")),
            ("127.0.0.2", &["127.0.0.0/8:8080"], None),
            ("::1", &["[::1]:8080"], None),
            ("::1", &["[::1]:9"], Some("loopback")),
            // The master's own address, on any port; opened by an entry, but on its own port.
            ("192.168.1.5", &[], Some("own address")),
            ("2002:c0a8:105::1", &[], Some("own address")),
            ("192.168.1.5", &["192.168.1.5"], None),
        ];
        for (addr, allow, expected) in cases {
            check(addr, allow, *expected);
        }
    }

    /// Regression: `--http-allow 127.0.0.1` to reach a service beside the master opened the
    /// master's own API too; only an entry naming its port opens it now.
    #[test]
    fn the_masters_own_port_is_opened_only_by_an_entry_that_names_it() {
        check_on("192.168.1.5", 7420, &[], Some("own address"));
        check_on("192.168.1.5", 7420, &["192.168.1.5"], Some("own address"));
        check_on("192.168.1.5", 7420, &["192.168.1.0/24"], Some("own address"));
        check_on("::ffff:192.168.1.5", 7420, &["192.168.1.5"], Some("own address"));
        check_on("2002:c0a8:105::1", 7420, &["192.168.1.5"], Some("own address"));
        check_on("192.168.1.5", 7420, &["192.168.1.5:7420"], None);
        check_on("192.168.1.5", 7421, &[], Some("own address"));
        check_on("192.168.1.5", 7421, &["192.168.1.5"], None);
        check_on("192.168.1.5", 7421, &["192.168.1.5:7421"], None);
        check_on("192.168.1.5", 7421, &["192.168.1.5:7420"], Some("own address"));
        // Regression: `--http-allow 0.0.0.0` opened the master's own port, which a connection to
        // the unspecified address reaches on this machine.
        check_on("0.0.0.0", 7420, &["0.0.0.0"], Some("own address"));
        check_on("0.0.0.0", 7420, &["0.0.0.0/0"], Some("own address"));
        check_on("::ffff:0.0.0.0", 7420, &["0.0.0.0"], Some("own address"));
        check_on("::", 7420, &["::"], Some("own address"));
        check_on("0.0.0.0", 7420, &["0.0.0.0:7420"], None);
        check_on("0.0.0.0", 7421, &["0.0.0.0"], None);
        let policy =
            OutboundPolicy::new(vec!["192.168.1.5".parse().unwrap()]).listening_on("192.168.1.5:7420".parse().unwrap());
        let e = policy.check_ip("192.168.1.5".parse().unwrap(), Some(7420)).unwrap_err().to_string();
        assert!(e.contains("own address") && e.contains("--http-allow 192.168.1.5:7420"), "{e}");
        // A port not known (a name resolved outside [`sending`]) is judged by the IP alone.
        assert!(policy.check_ip("192.168.1.5".parse().unwrap(), None).is_ok());
        let strict = OutboundPolicy::new(Vec::new()).listening_on("192.168.1.5:7420".parse().unwrap());
        assert!(strict.check_ip("192.168.1.5".parse().unwrap(), None).is_err());
        // An entry with a port never opens a request whose port is not known.
        let ported = OutboundPolicy::new(vec!["127.0.0.1:8080".parse().unwrap()]);
        assert!(ported.check_ip("127.0.0.1".parse().unwrap(), None).is_err());
    }

    /// A name resolves through the policy with the port [`sending`] scoped, and with none
    /// outside it.
    #[tokio::test]
    async fn a_name_is_judged_with_the_port_of_the_request_that_resolves_it() {
        use reqwest::dns::Resolve;
        let rules = OutboundPolicy::new(vec!["127.0.0.1:8080".parse().unwrap()]).rules;
        let resolve = |rules: Arc<Rules>| async move {
            Resolver { rules }
                .resolve("localhost".parse().unwrap())
                .await
                .map(|addrs| addrs.map(|a| a.ip()).collect::<Vec<_>>())
                .map_err(|e| e.to_string())
        };
        let on = |port: u16| reqwest::Url::parse(&format!("http://localhost:{port}/")).unwrap();
        let kept = sending(&on(8080), resolve(rules.clone())).await.unwrap();
        assert!(kept.contains(&"127.0.0.1".parse().unwrap()), "{kept:?}");
        let refused = sending(&on(8081), resolve(rules.clone())).await.unwrap_err();
        assert!(refused.contains("127.0.0.1: a loopback address"), "{refused}");
        assert!(resolve(rules).await.is_err());
    }

    #[test]
    fn a_master_listening_on_all_addresses_refuses_each_interface_address() {
        let interfaces = interface_addresses();
        assert!(interfaces.contains(&IpAddr::V4(Ipv4Addr::LOCALHOST)), "{interfaces:?}");
        let policy = OutboundPolicy::new(Vec::new()).listening_on("0.0.0.0:7420".parse().unwrap());
        for ip in interfaces.iter().filter(|ip| ip.is_ipv4()) {
            assert!(policy.check_ip(*ip, Some(7420)).is_err(), "{ip} is this master's own");
        }
        // With no port known, every port of an own address is its own; --http-allow opens it.
        let own: IpAddr = "192.0.2.7".parse().unwrap();
        let policy = OutboundPolicy::new(Vec::new()).own_addresses(vec![own]);
        let e = policy.check_ip(own, Some(80)).unwrap_err().to_string();
        assert!(e.contains("own address") && e.contains("--http-allow 192.0.2.7"), "{e}");
        let policy = OutboundPolicy::new(vec!["192.0.2.7".parse().unwrap()]).own_addresses(vec![own]);
        assert!(policy.check_ip(own, Some(80)).is_ok());
        assert!(policy.check_ip("192.0.2.8".parse().unwrap(), Some(80)).is_ok());
    }

    #[test]
    fn private_ranges_are_refused_when_asked() {
        let policy = OutboundPolicy::new(vec!["10.9.0.0/16".parse().unwrap()]).deny_private(true);
        for (addr, refused) in [
            ("10.1.2.3", true),
            ("10.9.1.1", false),
            ("172.31.0.1", true),
            ("192.168.0.1", true),
            ("fc00::1", true),
            ("100.64.0.1", true),
            ("100.127.255.254", true),
            ("100.128.0.1", false),
            ("64:ff9b::a00:1", true),
            ("::10.0.0.1", true),
        ] {
            assert_eq!(policy.check_ip(addr.parse().unwrap(), Some(80)).is_err(), refused, "{addr}");
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
            ("127.0.0.1:8080", Some("127.0.0.1/32:8080")),
            ("10.1.2.3/8:443", Some("10.0.0.0/8:443")),
            ("[::1]:8080", Some("[::1/128]:8080")),
            ("[fd00::/8]:443", Some("[fd00::/8]:443")),
            ("127.0.0.1:0", None),
            ("127.0.0.1:65536", None),
            ("127.0.0.1:", None),
            ("::1:8080", Some("::1:8080/128")),
            ("[::1]", None),
            ("[127.0.0.1]:80", Some("127.0.0.1/32:80")),
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
        let e = OutboundPolicy::default().check_ip("127.0.0.1".parse().unwrap(), Some(80)).unwrap_err().to_string();
        assert!(e.contains("127.0.0.1") && e.contains("--http-allow 127.0.0.1"), "{e}");
        let e = OutboundError::RefusedName {
            host: "localhost".into(),
            refused: vec![
                ("::1".parse().unwrap(), "a loopback address"),
                ("127.0.0.1".parse().unwrap(), "a loopback address"),
            ],
            allow: "::1".into(),
        }
        .to_string();
        assert!(
            e.contains("localhost") && e.contains("127.0.0.1: a loopback") && e.contains("--http-allow ::1"),
            "{e}"
        );
    }
}
