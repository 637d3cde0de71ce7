//! What the model needs to speak Consul's HTTP API the way Consul (a Go program) does: Go's
//! duration syntax, Go's `%q` quoting in error messages, go-memdb's UUID check, URL decoding as
//! `net/url` does it.

/// Go's `time.ParseDuration`: a signed sequence of decimal numbers, each with a unit (`ns`, `us`,
/// `µs`, `ms`, `s`, `m`, `h`), or `0`. Returns nanoseconds, or Go's error message.
pub(crate) fn parse_go_duration(text: &str) -> Result<i64, String> {
    let invalid = || format!("time: invalid duration {}", go_quote(text));
    let (negative, mut rest) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    if rest == "0" {
        return Ok(0);
    }
    if rest.is_empty() {
        return Err(invalid());
    }
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let digits = |s: &str| s.bytes().take_while(u8::is_ascii_digit).count();
        let whole_len = digits(rest);
        let whole = &rest[..whole_len];
        rest = &rest[whole_len..];
        let mut fraction = "";
        if let Some(after) = rest.strip_prefix('.') {
            let len = digits(after);
            fraction = &after[..len];
            rest = &after[len..];
        }
        if whole.is_empty() && fraction.is_empty() {
            return Err(invalid());
        }
        let unit_len = rest
            .char_indices()
            .find(|(_, c)| *c == '.' || c.is_ascii_digit())
            .map_or(rest.len(), |(at, _)| at);
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let scale: u128 = match unit {
            "" => return Err(format!("time: missing unit in duration {}", go_quote(text))),
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            other => {
                return Err(format!(
                    "time: unknown unit {} in duration {}",
                    go_quote(other),
                    go_quote(text)
                ));
            }
        };
        let whole: u128 = if whole.is_empty() {
            0
        } else {
            whole.parse().map_err(|_| invalid())?
        };
        let mut part = whole.checked_mul(scale).ok_or_else(invalid)?;
        // Go keeps at most the digits that still matter; so do we, and truncate like it does.
        let mut divisor: u128 = 1;
        let mut numerator: u128 = 0;
        for digit in fraction.bytes().take(20) {
            numerator = numerator * 10 + u128::from(digit - b'0');
            divisor *= 10;
        }
        part += numerator * scale / divisor;
        total = total.checked_add(part).ok_or_else(invalid)?;
        if total > i64::MAX as u128 {
            return Err(invalid());
        }
    }
    let total = i64::try_from(total).map_err(|_| invalid())?;
    Ok(if negative { -total } else { total })
}

/// Go's `%q` (`strconv.Quote`) of a string.
pub(crate) fn go_quote(text: &str) -> String {
    let mut quoted = String::with_capacity(text.len() + 2);
    quoted.push('"');
    for c in text.chars() {
        match c {
            '"' => quoted.push_str("\\\""),
            '\\' => quoted.push_str("\\\\"),
            '\u{7}' => quoted.push_str("\\a"),
            '\u{8}' => quoted.push_str("\\b"),
            '\u{c}' => quoted.push_str("\\f"),
            '\n' => quoted.push_str("\\n"),
            '\r' => quoted.push_str("\\r"),
            '\t' => quoted.push_str("\\t"),
            '\u{b}' => quoted.push_str("\\v"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                quoted.push_str(&format!("\\x{:02x}", c as u32));
            }
            c if c.is_control() => quoted.push_str(&format!("\\u{:04x}", c as u32)),
            c => quoted.push(c),
        }
    }
    quoted.push('"');
    quoted
}

/// go-memdb's check of a UUID index argument: `Ok` with the canonical (lowercase) form, or the
/// error Consul wraps as `failed session lookup: index error: …`.
pub(crate) fn parse_uuid(id: &str) -> Result<String, String> {
    if id.len() != 36 {
        return Err("UUID must be 36 characters".to_owned());
    }
    let dashes = id.matches('-').count();
    if dashes != 4 {
        return Err(format!("UUID should have maximum of 4 \"-\"; got {dashes}"));
    }
    let digits: Vec<u8> = id.bytes().filter(|b| *b != b'-').collect();
    if let Some(bad) = digits.iter().find(|b| !b.is_ascii_hexdigit()) {
        let c = char::from(*bad);
        let shown = if c.is_control() {
            format!("U+{:04X}", u32::from(*bad))
        } else {
            format!("U+{:04X} '{c}'", u32::from(*bad))
        };
        return Err(format!("Invalid UUID: encoding/hex: invalid byte: {shown}"));
    }
    Ok(id.to_ascii_lowercase())
}

/// `failed session lookup: index error: …`, the answer to a session ID that is no UUID.
pub(crate) fn session_lookup_error(uuid_error: &str) -> String {
    format!("failed session lookup: index error: {uuid_error}")
}

/// Percent-decodes a URL path as `net/url` does (`+` stays `+`); `None` for a bad escape.
pub(crate) fn decode_path(path: &str) -> Option<String> {
    unescape(path, false)
}

fn unescape(text: &str, plus_is_space: bool) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = bytes.get(i + 1..i + 3)?;
                let hex = std::str::from_utf8(hex).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' if plus_is_space => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// `url.ParseQuery` as `req.URL.Query()` uses it: pairs split on `&` (and `;`, as the Go that
/// built Consul 1.8 did), each name and value unescaped; a pair that does not decode is dropped.
pub(crate) fn parse_query(query: &str) -> Vec<(String, String)> {
    query
        .split(['&', ';'])
        .filter(|pair| !pair.is_empty())
        .filter_map(|pair| {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            Some((unescape(name, true)?, unescape(value, true)?))
        })
        .collect()
}

/// `url.Values.Encode`: the pairs sorted by name, escaped as `url.QueryEscape` does.
pub(crate) fn encode_query(pairs: &[(String, String)]) -> String {
    let mut sorted: Vec<&(String, String)> = pairs.iter().collect();
    // Go sorts the names and keeps each name's values in order.
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    sorted
        .iter()
        .map(|(name, value)| format!("{}={}", query_escape(name), query_escape(value)))
        .collect::<Vec<_>>()
        .join("&")
}

fn query_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(char::from(b));
            }
            b' ' => out.push('+'),
            b => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_as_go_parses_them() {
        assert_eq!(parse_go_duration("15000ms"), Ok(15_000_000_000));
        assert_eq!(parse_go_duration("0ms"), Ok(0));
        assert_eq!(parse_go_duration("0"), Ok(0));
        assert_eq!(parse_go_duration("1h2m3.5s"), Ok(3_723_500_000_000));
        assert_eq!(parse_go_duration("-1.5s"), Ok(-1_500_000_000));
        assert_eq!(parse_go_duration("1µs"), Ok(1_000));
        assert_eq!(
            parse_go_duration("bogus"),
            Err("time: invalid duration \"bogus\"".to_owned())
        );
        assert_eq!(
            parse_go_duration("5"),
            Err("time: missing unit in duration \"5\"".to_owned())
        );
        assert_eq!(
            parse_go_duration("5x"),
            Err("time: unknown unit \"x\" in duration \"5x\"".to_owned())
        );
        assert!(parse_go_duration("").is_err());
        assert!(parse_go_duration("99999999999h").is_err());
    }

    #[test]
    fn uuids_are_checked_as_memdb_checks_them() {
        assert_eq!(
            parse_uuid("garbage"),
            Err("UUID must be 36 characters".to_owned())
        );
        assert_eq!(
            parse_uuid("zzzzzzzz-0000-0000-0000-000000000000"),
            Err("Invalid UUID: encoding/hex: invalid byte: U+007A 'z'".to_owned())
        );
        assert_eq!(
            parse_uuid("ABCDEF00-0000-0000-0000-000000000000").as_deref(),
            Ok("abcdef00-0000-0000-0000-000000000000")
        );
        assert!(parse_uuid("00000000-0000-0000-0000-0000000000-0").is_err());
    }

    #[test]
    fn urls_decode_as_net_url_decodes_them() {
        assert_eq!(
            decode_path("/v1/kv/a%2Fb+c").as_deref(),
            Some("/v1/kv/a/b+c")
        );
        assert_eq!(decode_path("/v1/kv/%zz"), None);
        assert_eq!(
            parse_query("recurse&index=5&wait=10s&a+b=c%20d"),
            vec![
                ("recurse".to_owned(), String::new()),
                ("index".to_owned(), "5".to_owned()),
                ("wait".to_owned(), "10s".to_owned()),
                ("a b".to_owned(), "c d".to_owned()),
            ]
        );
        let pairs = parse_query("cas=1&acquire=x y");
        assert_eq!(encode_query(&pairs), "acquire=x+y&cas=1");
        assert_eq!(go_quote("a\"b\n"), "\"a\\\"b\\n\"");
    }
}
