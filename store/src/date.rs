//! Dates as MongoDB's extended JSON writes them: `{"$date": "2026-12-06T14:00:00.000Z"}`.
//!
//! Documents are JSON, which has no date type. A one-key object `{"$date": "<RFC 3339>"}` is
//! how a BSON date reads back from MongoDB (relaxed extended JSON), so tailrace takes it as a
//! date everywhere: the MongoDB engine stores it as a BSON date, filters compare it by
//! instant ([`crate::filter`]), and queries truncate and group by it ([`crate::query`]). The
//! same instant may be spelled several ways (`.000Z`, `Z`, `+02:00`): compare [`millis`], not
//! the strings.

use std::time::{Duration, SystemTime};

use serde_json::{Map, Value};

/// 9999-12-31T23:59:59.999Z: RFC 3339 has four digits of year.
const LAST_MS: i64 = 253_402_300_799_999;

/// Milliseconds since the epoch of a date value: `{"$date": "<RFC 3339>"}`, or
/// `{"$date": {"$numberLong": "<ms>"}}` (how extended JSON writes a date outside the years 1970
/// to 9999). `None` for anything else.
pub fn millis(v: &Value) -> Option<i64> {
    let o = v.as_object().filter(|o| o.len() == 1)?;
    match o.get("$date")? {
        Value::String(s) => parse_rfc3339(s),
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
    let t = SystemTime::UNIX_EPOCH + Duration::from_millis(ms as u64);
    let mut o = Map::new();
    o.insert(
        "$date".to_owned(),
        Value::String(humantime::format_rfc3339_millis(t).to_string()),
    );
    Some(Value::Object(o))
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
