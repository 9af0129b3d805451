//! Kubernetes resource quantities (`500m`, `1.5Gi`, `2e3`), read and written as Kubernetes does.
//!
//! A quantity may reach the engine as a string or as a number: the API server sends strings, but
//! a manifest given to `inject` says `cpu: 1` or `cpu: 0.5`, and a template says it the same way,
//! and the API server accepts both (`Quantity.UnmarshalJSON` reads a number's text as the
//! quantity). Every step that reads one (padding, shares, init peaks, resize and enforcement
//! floors, comparisons) reads it here, so no step can take `cpu: 1` for "no limit". A value that
//! is neither, or text that is no quantity (`1.5.0`, `12 Gi`), is no quantity: [`problem`] says
//! so in words for the checks that refuse it.
//!
//! Values are exact: nano-units in an `i128` (`Ei` is 2^60, times 10^9, fits).

use std::borrow::Cow;

use serde_json::Value;

/// The text of a quantity as written: a string as it is, a number as its JSON text (`1`, `0.5`),
/// as the API server reads it. `None` for any other JSON value.
pub fn text(value: &Value) -> Option<Cow<'_, str>> {
    match value {
        Value::String(text) => Some(Cow::Borrowed(text.as_str())),
        Value::Number(number) => Some(Cow::Owned(number.to_string())),
        _ => None,
    }
}

/// A quantity written as a string or a number, in nano-units; `None` when it is no quantity.
pub fn of(value: &Value) -> Option<i128> {
    text(value).as_deref().and_then(parse)
}

/// Whether two values are the same quantity, however each is written (`"1000m"`, `1`, `"1"`).
pub fn equal(a: &Value, b: &Value) -> bool {
    matches!((of(a), of(b)), (Some(x), Some(y)) if x == y)
}

/// Why `value` is no Kubernetes quantity (`None` when it is one), in words for a message.
pub fn problem(value: &Value) -> Option<String> {
    match text(value) {
        None => Some(format!("{value} is not a quantity (a string such as \"500m\" or \"1Gi\", or a number)")),
        Some(text) if parse(&text).is_none() => Some(format!(
            "{value} is not a quantity: quantities are a number with an optional suffix (n, u, m, k, M, G, T, P, E, Ki, Mi, Gi, Ti, Pi, Ei, or an exponent like e3), with no space"
        )),
        Some(_) => None,
    }
}

/// Nano-units in one unit.
pub const NANO: i128 = 1_000_000_000;

/// A Kubernetes quantity in nano-units (`100m` is 100,000,000): a signed decimal number and a
/// binary (`Ki`..`Ei`), decimal (`n`, `u`, `m`, `k`..`E`) or exponent (`e3`) suffix; rounded up to
/// a nano-unit, as Kubernetes rounds. `None` for anything else, or too large.
pub fn parse(text: &str) -> Option<i128> {
    let text = text.trim();
    if text.is_empty() || text.len() > 40 {
        return None;
    }
    let (negative, rest) = match text.as_bytes()[0] {
        b'-' => (true, &text[1..]),
        b'+' => (false, &text[1..]),
        _ => (false, text),
    };
    let number_end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
    let (number, suffix) = rest.split_at(number_end);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() || fraction.contains('.') {
        return None;
    }
    let digits = format!("{whole}{fraction}");
    let mantissa: i128 = digits.parse().ok()?;
    let scale = i32::try_from(fraction.len()).ok()?;
    // The suffix as (multiplier, power of ten), applied to nano-units.
    let (multiplier, power): (i128, i32) = match suffix {
        "" => (1, 0),
        "n" => (1, -9),
        "u" => (1, -6),
        "m" => (1, -3),
        "k" => (1, 3),
        "M" => (1, 6),
        "G" => (1, 9),
        "T" => (1, 12),
        "P" => (1, 15),
        "E" => (1, 18),
        "Ki" => (1 << 10, 0),
        "Mi" => (1 << 20, 0),
        "Gi" => (1 << 30, 0),
        "Ti" => (1 << 40, 0),
        "Pi" => (1 << 50, 0),
        "Ei" => (1 << 60, 0),
        exponent if exponent.starts_with(['e', 'E']) => {
            (1, exponent[1..].parse::<i32>().ok().filter(|e| (-30..=30).contains(e))?)
        }
        _ => return None,
    };
    // value = mantissa * multiplier * 10^(power - scale) units = that * 10^9 nano-units.
    let exponent = power - scale + 9;
    let scaled = mantissa.checked_mul(multiplier)?;
    let nanos = if exponent >= 0 {
        scaled.checked_mul(10i128.checked_pow(u32::try_from(exponent).ok()?)?)?
    } else {
        let divisor = 10i128.checked_pow(u32::try_from(-exponent).ok()?)?;
        // Rounded up (`scaled` is not negative), without overflowing near the top of the range.
        scaled / divisor + i128::from(scaled % divisor != 0)
    };
    Some(if negative { -nanos } else { nanos })
}

/// Writes nano-units as Kubernetes writes a quantity of the format `like` has (`Quantity.String`):
/// binary (`Mi`-style: the largest power of 1024 that keeps it exact; a fraction, or a value
/// below 1024, as decimal), decimal exponent (`e3`-style) or decimal (`M`-style, and plain numbers,
/// which Kubernetes reads as decimal: `1000` is written `1k`), in the largest unit of a power of
/// 1000 that keeps it exact; fractions as `m`, `u` or `n` (`e-3`.. for the exponent format). So
/// what this writes is what the API server stores.
pub fn format(nanos: i128, like: &str) -> String {
    let sign = if nanos < 0 { "-" } else { "" };
    // `i128::MIN` has no `abs`; its magnitude fits the unsigned type.
    let nanos = nanos.unsigned_abs();
    let like = like.trim_end();
    // `1e3` is the exponent format; `1E` is exa, a decimal suffix.
    let suffix = like.trim_start_matches(['+', '-']).trim_start_matches(|c: char| c.is_ascii_digit() || c == '.');
    let exponent = suffix.len() > 1 && suffix.starts_with(['e', 'E']);
    // Binary only where a binary suffix is exact: a bare number is read back as decimal (and
    // stored as `100M`, not `100000000`).
    let nano = NANO.unsigned_abs();
    let binary = like.ends_with('i')
        && nanos.is_multiple_of(nano)
        && nanos / nano >= 1024
        && (nanos / nano).is_multiple_of(1024);
    if !nanos.is_multiple_of(nano) {
        let units: [(u128, &str, &str); 3] = [(1_000_000, "m", "e-3"), (1_000, "u", "e-6"), (1, "n", "e-9")];
        let (divisor, decimal, power) =
            units.into_iter().find(|(d, _, _)| nanos.is_multiple_of(*d)).unwrap_or((1, "n", "e-9"));
        return format!("{sign}{}{}", nanos / divisor, if exponent { power } else { decimal });
    }
    let units = nanos / nano;
    let families: &[(u128, &str)] = match (binary, exponent) {
        (true, _) => {
            &[(1 << 60, "Ei"), (1 << 50, "Pi"), (1 << 40, "Ti"), (1 << 30, "Gi"), (1 << 20, "Mi"), (1 << 10, "Ki")]
        }
        (false, true) => &[
            (1_000_000_000_000_000_000, "e18"),
            (1_000_000_000_000_000, "e15"),
            (1_000_000_000_000, "e12"),
            (1_000_000_000, "e9"),
            (1_000_000, "e6"),
            (1_000, "e3"),
        ],
        (false, false) => &[
            (1_000_000_000_000_000_000, "E"),
            (1_000_000_000_000_000, "P"),
            (1_000_000_000_000, "T"),
            (1_000_000_000, "G"),
            (1_000_000, "M"),
            (1_000, "k"),
        ],
    };
    match families.iter().find(|(unit, _)| units != 0 && units.is_multiple_of(*unit)) {
        Some((unit, suffix)) => format!("{sign}{}{suffix}", units / unit),
        None => format!("{sign}{units}"),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_quantity_is_read_however_it_is_written() {
        // (value, nano-units)
        let cases = [
            (json!("1"), Some(NANO)),
            (json!(1), Some(NANO)),
            (json!(0.5), Some(NANO / 2)),
            (json!("0.5"), Some(NANO / 2)),
            (json!(1.5e3), Some(1_500 * NANO)),
            (json!("1.5Gi"), Some(1_610_612_736 * NANO)),
            (json!("1.5.0"), None),
            (json!("12 Gi"), None),
            (json!(true), None),
            (json!(null), None),
        ];
        for (value, nanos) in cases {
            assert_eq!(of(&value), nanos, "{value}");
            assert_eq!(problem(&value).is_none(), nanos.is_some(), "{value}");
        }
        assert!(problem(&json!("12 Gi")).unwrap().contains("\"12 Gi\" is not a quantity"));
    }

    #[test]
    fn written_as_the_api_server_writes_it() {
        // (nano-units, the author's format, what Kubernetes stores)
        let cases = [
            (1_000 * NANO, "500", "1k"),
            (1_500 * NANO, "500", "1500"),
            (NANO * 3 / 2, "1", "1500m"),
            (2_000 * NANO, "1e3", "2e3"),
            (1_500 * NANO, "1e3", "1500"),
            (NANO * 3 / 2, "1e3", "1500e-3"),
            (1_536 * NANO, "1Ki", "1536"),
            (512 * NANO, "1Ki", "512"),
            (NANO / 2, "1Mi", "500m"),
            (1_024 * NANO, "1Ki", "1Ki"),
            // A bare number is read back as decimal: one a binary suffix does not fit goes decimal.
            (100_000_000 * NANO, "16Mi", "100M"),
            (1_000_000_000 * NANO, "1Mi", "1G"),
            (2 * 1_000_000_000_000_000_000 * NANO, "1E", "2E"),
        ];
        for (nanos, like, stored) in cases {
            assert_eq!(format(nanos, like), stored, "{nanos} like {like}");
        }
    }

    #[test]
    fn quantities_parse_exactly_and_write_back_in_the_authors_family() {
        // (text, nano-units)
        let cases: [(&str, i128); 12] = [
            ("200m", 200_000_000),
            ("1", NANO),
            ("1.5", 1_500_000_000),
            ("128Mi", 128 * (1 << 20) * NANO),
            ("1Gi", (1 << 30) * NANO),
            ("2k", 2_000 * NANO),
            ("1e3", 1_000 * NANO),
            ("1E", 1_000_000_000_000_000_000 * NANO),
            ("0.1m", 100_000),
            ("1n", 1),
            ("+5", 5 * NANO),
            ("-1m", -1_000_000),
        ];
        for (text, nanos) in cases {
            assert_eq!(parse(text), Some(nanos), "{text}");
        }
        for bad in ["", "m", "1.2.3", "1Xi", "1e99", "abc", "1 Mi", "1ki", "1e-2147483648"] {
            assert_eq!(parse(bad), None, "{bad}");
        }
        // Rounded up to a nano-unit near the top of the range, without overflowing.
        let near_the_top = parse(".0000000147573952589676412927Ei").unwrap();
        assert!(near_the_top > 17_014_118_346_046_923_172, "{near_the_top}");
        assert!(format(i128::MIN, "1").starts_with("-170141183460469231731"));
        // (nano-units, written like, text)
        let written = [
            (160 * (1 << 20) * NANO, "128Mi", "160Mi"),
            (2 * (1 << 30) * NANO, "1Gi", "2Gi"),
            (210_000_000, "200m", "210m"),
            (2 * NANO, "1", "2"),
            (1_500 * NANO, "1k", "1500"),
            (3_000_000 * NANO, "1M", "3M"),
            (100_000, "1", "100u"),
            (0, "1Mi", "0"),
        ];
        for (nanos, like, text) in written {
            assert_eq!(format(nanos, like), text, "{nanos} like {like}");
            assert_eq!(parse(text), Some(nanos));
        }
    }
}
