//! Durations as `consul lock` writes them (Go's syntax): `500ms`, `5s`, `1m30s`, `2h`.

use std::time::Duration;

/// Parses a Go-style duration: one or more `<number><unit>` with unit `ns`, `us`, `ms`, `s`, `m`
/// or `h` (decimals allowed, as in `1.5s`), or a bare `0`.
pub(crate) fn parse(text: &str) -> Result<Duration, String> {
    let bad = || {
        format!(
            "invalid duration {text:?}: write a number and a unit, like 500ms, 10s, 1m30s or 2h"
        )
    };
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    let mut rest = text;
    let mut total = Duration::ZERO;
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let (number, tail) = rest.split_at(number_len);
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let seconds_per_unit = match unit {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        let value: f64 = number.parse().map_err(|_| bad())?;
        total += Duration::try_from_secs_f64(value * seconds_per_unit).map_err(|_| bad())?;
        rest = tail;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_go_durations() {
        assert_eq!(parse("0"), Ok(Duration::ZERO));
        assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse("2h"), Ok(Duration::from_secs(7200)));
        for bad in ["", "5", "5 s", "s", "1x", "-1s", "1.2.3s"] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }
}
