//! What backends' address parsing shares: whether an address names its port, a host without
//! the brackets of an IPv6 literal, and a URL's `%XX` escapes decoded.

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

/// `text` (a URL's user, password or path) with its `%XX` escapes decoded; anything else, a `%`
/// not followed by two hex digits among it, kept as it is. Bytes that are not UTF-8 are replaced.
///
/// ```
/// use lease_core::address::percent_decoded;
///
/// assert_eq!(percent_decoded("p%40ss%2Fw%zz"), "p@ss/w%zz");
/// assert_eq!(percent_decoded("%aé"), "%aé");
/// ```
pub fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&byte) = bytes.get(i) {
        // Two hex digits, checked byte by byte: `from_str_radix` would also take a sign (`%+4`).
        let hex = (bytes.get(i + 1..i + 3))
            .filter(|h| h.iter().all(u8::is_ascii_hexdigit))
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (byte, hex) {
            (b'%', Some(decoded)) => {
                out.push(decoded);
                i += 3;
            }
            _ => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::{has_port, percent_decoded};

    #[test]
    fn decodes_escapes_and_keeps_what_is_not_one() {
        assert_eq!(percent_decoded("a%20b%2f%2F"), "a b//");
        // A `%` before a multi-byte character, or at the end, is not an escape (and no panic).
        for kept in ["%aé", "%é", "%", "%4", "100%", "%+4", "%-1"] {
            assert_eq!(percent_decoded(kept), kept);
        }
    }

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
