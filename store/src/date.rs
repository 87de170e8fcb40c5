//! Dates as MongoDB's extended JSON writes them: `{"$date": "2026-12-06T14:00:00.000Z"}`.
//!
//! Documents are JSON, which has no date type. A one-key object `{"$date": "<RFC 3339>"}` is
//! how a BSON date reads back from MongoDB (relaxed extended JSON), so tailrace takes it as a
//! date everywhere: the MongoDB engine stores it as a BSON date, filters compare it by
//! instant ([`crate::filter`]), and queries truncate and group by it ([`crate::query`]). The
//! same instant may be spelled several ways (`.000Z`, `Z`, `+02:00`): compare [`millis`], not
//! the strings.

use std::time::SystemTime;

use serde_json::{Map, Value};

/// 9999-12-31T23:59:59.999Z: RFC 3339 has four digits of year.
const LAST_MS: i64 = 253_402_300_799_999;

/// Milliseconds since the epoch of a date value: `{"$date": "<RFC 3339>"}`, or
/// `{"$date": {"$numberLong": "<ms>"}}` (how extended JSON writes a date outside the years 1970
/// to 9999). `None` for anything else.
pub fn millis(v: &Value) -> Option<i64> {
    let o = v.as_object().filter(|o| o.len() == 1)?;
    match o.get("$date")? {
        Value::String(s) => parse_written(s).or_else(|| parse_rfc3339(s)),
        Value::Object(n) if n.len() == 1 => n.get("$numberLong")?.as_str()?.parse().ok(),
        _ => None,
    }
}

/// Whether `v` is a date value ([`millis`] reads it).
pub fn is_date(v: &Value) -> bool {
    millis(v).is_some()
}

/// A date as extended JSON, to the millisecond (`.000Z`), or `None` outside the years 1970 to
/// 9999.
pub fn value(ms: i64) -> Option<Value> {
    if !(0..=LAST_MS).contains(&ms) {
        return None;
    }
    let mut o = Map::new();
    o.insert("$date".to_owned(), Value::String(write(ms)));
    Some(Value::Object(o))
}

/// `ms` (within the years 1970 to 9999) as `YYYY-MM-DDTHH:MM:SS.mmmZ`, the text
/// `humantime::format_rfc3339_millis` writes. By hand because a query writes one per document
/// it truncates to a time bucket; `dates_are_written_and_read_as_humantime_does` compares the
/// two over random instants.
fn write(ms: i64) -> String {
    let (days, in_day) = (ms.div_euclid(DAY_MS), ms.rem_euclid(DAY_MS));
    let (y, m, d) = civil_from_days(days);
    let (h, mi, sec, milli) = (
        in_day / 3_600_000,
        in_day / 60_000 % 60,
        in_day / 1000 % 60,
        in_day % 1000,
    );
    let mut b = *b"0000-00-00T00:00:00.000Z";
    let mut put = |at: usize, width: usize, mut n: i64| {
        for k in (at..at + width).rev() {
            b[k] = b'0' + (n % 10) as u8;
            n /= 10;
        }
    };
    put(0, 4, y);
    put(5, 2, m);
    put(8, 2, d);
    put(11, 2, h);
    put(14, 2, mi);
    put(17, 2, sec);
    put(20, 3, milli);
    b.iter().map(|&c| char::from(c)).collect()
}

/// Milliseconds since the epoch of a date in the form [`value`] writes
/// (`YYYY-MM-DDTHH:MM:SS.mmmZ`, from 1970 on), read by hand; `None` for any other text, which
/// [`parse_rfc3339`] then reads. A query compares or truncates a stored event's received time
/// on every document it reads, and every stored one has this form.
fn parse_written(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() != 24
        || [
            (4, b'-'),
            (7, b'-'),
            (10, b'T'),
            (13, b':'),
            (16, b':'),
            (19, b'.'),
            (23, b'Z'),
        ]
        .iter()
        .any(|&(at, c)| b[at] != c)
    {
        return None;
    }
    let num = |from: usize, to: usize| {
        b[from..to].iter().try_fold(0i64, |n, &c| {
            c.is_ascii_digit().then(|| n * 10 + i64::from(c - b'0'))
        })
    };
    let (y, m, d) = (num(0, 4)?, num(5, 7)?, num(8, 10)?);
    let (h, mi, sec, milli) = (num(11, 13)?, num(14, 16)?, num(17, 19)?, num(20, 23)?);
    if y < 1970 || !(1..=12).contains(&m) || d < 1 || d > days_in_month(y, m) {
        return None;
    }
    if h > 23 || mi > 59 || sec > 59 {
        return None;
    }
    Some(days_from_civil(y, m, d) * DAY_MS + ((h * 60 + mi) * 60 + sec) * 1000 + milli)
}

const DAY_MS: i64 = 86_400_000;

fn days_in_month(y: i64, m: i64) -> i64 {
    match m {
        2 if y % 4 == 0 && (y % 100 != 0 || y % 400 == 0) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a date of the proleptic Gregorian calendar (Howard Hinnant's
/// `days_from_civil`: years counted from March, in eras of 400 years).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * ((m + 9) % 12) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The inverse of [`days_from_civil`]: (year, month, day).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// Milliseconds since the epoch of an RFC 3339 time (`2026-12-06T14:00:00Z`, fractions and
/// offsets allowed), from 1970 on.
pub fn parse_rfc3339(s: &str) -> Option<i64> {
    let t = humantime::parse_rfc3339_weak(s).ok()?;
    let d = t.duration_since(SystemTime::UNIX_EPOCH).ok()?;
    i64::try_from(d.as_millis()).ok()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use std::time::Duration;

    #[test]
    fn one_instant_reads_the_same_however_it_is_spelled() {
        let ms = 1_765_029_600_000;
        for v in [
            json!({"$date": "2025-12-06T14:00:00.000Z"}),
            json!({"$date": "2025-12-06T14:00:00Z"}),
            json!({"$date": {"$numberLong": "1765029600000"}}),
        ] {
            assert_eq!(millis(&v), Some(ms), "{v}");
        }
        assert_eq!(
            value(ms),
            Some(json!({"$date": "2025-12-06T14:00:00.000Z"}))
        );
    }

    /// The hand-written reading and writing of the stored form agree with humantime's over
    /// random instants of the whole range, and over texts of that shape whose fields go past
    /// their ranges: what the hand-written reading takes, humantime reads the same; it leaves
    /// only impossible dates to humantime.
    #[test]
    fn dates_are_written_and_read_as_humantime_does() {
        use proptest::prelude::*;
        let by_humantime = |ms: i64| {
            humantime::format_rfc3339_millis(
                SystemTime::UNIX_EPOCH + Duration::from_millis(ms as u64),
            )
            .to_string()
        };
        proptest!(ProptestConfig::with_cases(20_000), |(ms in 0..=LAST_MS)| {
            let text = by_humantime(ms);
            prop_assert_eq!(&write(ms), &text);
            prop_assert_eq!(parse_written(&text), Some(ms));
        });
        // Each field from a little below its range to a little above it.
        let fields = (
            1960i64..=9999,
            0i64..=13,
            0i64..=32,
            0i64..=24,
            0i64..=60,
            0i64..=60,
            0i64..=999,
        );
        proptest!(ProptestConfig::with_cases(20_000), |((y, m, d, h, mi, sec, milli) in fields)| {
            let text = format!("{y:04}-{m:02}-{d:02}T{h:02}:{mi:02}:{sec:02}.{milli:03}Z");
            match parse_written(&text) {
                Some(ms) => prop_assert_eq!(parse_rfc3339(&text), Some(ms), "{}", text),
                None => prop_assert!(
                    y < 1970 || m == 0 || m == 13 || d == 0 || d > days_in_month(y, m) || h == 24 || mi == 60 || sec == 60,
                    "{} was left to humantime", text
                ),
            }
        });
        // The edges: the first and last instants, a leap day, a day that does not exist.
        assert_eq!(parse_written("1970-01-01T00:00:00.000Z"), Some(0));
        assert_eq!(parse_written("9999-12-31T23:59:59.999Z"), Some(LAST_MS));
        assert_eq!(write(LAST_MS), "9999-12-31T23:59:59.999Z");
        assert_eq!(
            parse_written("2024-02-29T12:00:00.000Z"),
            parse_rfc3339("2024-02-29T12:00:00Z")
        );
        assert_eq!(parse_written("2025-02-29T12:00:00.000Z"), None);
        assert_eq!(parse_written("1969-12-31T23:59:59.999Z"), None);
        assert_eq!(parse_written("2025-12-06T14:00:00Z"), None);
    }

    #[test]
    fn only_a_one_key_date_object_is_a_date() {
        for v in [
            json!({"$date": 5}),
            json!({"$date": "yesterday"}),
            json!({"$date": "2025-12-06T14:00:00Z", "x": 1}),
            json!("2025-12-06T14:00:00Z"),
            json!({"$date": {"$numberLong": "x"}}),
        ] {
            assert!(!is_date(&v), "{v}");
        }
        assert_eq!(value(-1), None);
        assert_eq!(value(LAST_MS + 1), None);
    }
}
