//! What backends' address parsing shares: whether an address names its port, and a host without
//! the brackets of an IPv6 literal.

/// Whether `address` (`host:port`, `[v6]:port`, or a URL `scheme://user:password@host:port/path`)
/// gives a port. URL parsers fill in the scheme's default port and then forget it was not
/// given, so a message about an address without one would not say which port was assumed.
pub fn has_port(address: &str) -> bool {
    let rest = address.split_once("://").map_or(address, |(_, rest)| rest);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or(rest);
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let after_host = match host_port.rfind(']') {
        Some(end) => &host_port[end..],
        None => host_port,
    };
    after_host.contains(':')
}

/// A URL's host as a name to connect to or to check a certificate against: an IPv6 literal
/// without the brackets a URL writes it in.
pub fn bare_host(host: &str) -> &str {
    (host.strip_prefix('[').and_then(|h| h.strip_suffix(']'))).unwrap_or(host)
}

#[cfg(test)]
mod tests {
    use super::has_port;

    #[test]
    fn finds_a_port_only_where_one_is_given() {
        for with in [
            "h:1",
            "http://h:8500",
            "amqp://u:p@h:5672/%2f",
            "amqp://u:p@h:5672",
            "[::1]:8500",
            "http://[::1]:8500/",
        ] {
            assert!(has_port(with), "{with}");
        }
        for without in [
            "h",
            "http://h",
            "https://h/",
            "amqp://u:p@h/%2f",
            "amqp://u@h?heartbeat=5",
            "[::1]",
            "http://[::1]/",
        ] {
            assert!(!has_port(without), "{without}");
        }
    }

    #[test]
    fn an_ipv6_host_loses_its_brackets_and_others_stay() {
        use super::bare_host;
        assert_eq!(bare_host("[::1]"), "::1");
        assert_eq!(bare_host("127.0.0.1"), "127.0.0.1");
        assert_eq!(bare_host("consul.local"), "consul.local");
    }
}
