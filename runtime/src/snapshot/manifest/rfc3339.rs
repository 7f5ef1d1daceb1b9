//! The manifest's times: RFC 3339 in UTC, second precision, written and read back without a
//! date library.

use std::time::{SystemTime, UNIX_EPOCH};

/// Now as RFC 3339 in UTC, second precision.
pub fn rfc3339_now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    rfc3339_at(secs)
}

/// `secs` since the epoch as RFC 3339 in UTC.
pub fn rfc3339_at(secs: u64) -> String {
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// The seconds since the epoch of an RFC 3339 UTC time as [`rfc3339_at`] writes it
/// (`YYYY-MM-DDTHH:MM:SSZ`); None for anything else.
pub fn rfc3339_secs(text: &str) -> Option<u64> {
    let b = text.as_bytes();
    if b.len() != 20 || b[4] != b'-' || b[7] != b'-' || b[10] != b'T' || !text.ends_with('Z') {
        return None;
    }
    let num = |r: std::ops::Range<usize>| text.get(r)?.parse::<i64>().ok();
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, m, s) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || h > 23 || m > 59 || s > 60 {
        return None;
    }
    // Days since 1970-01-01 from a civil date (the inverse of rfc3339_at's).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    u64::try_from(days * 86_400 + h * 3600 + m * 60 + s).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_reads_back_what_it_writes() {
        for secs in [0, 951_782_400, 1_764_590_400, 4_102_444_799] {
            assert_eq!(rfc3339_secs(&rfc3339_at(secs)), Some(secs));
        }
        assert_eq!(rfc3339_secs("2026-12-01T10:00:00.123Z"), None);
        assert_eq!(rfc3339_secs("2026-13-01T10:00:00Z"), None);
        assert_eq!(rfc3339_secs("yesterday"), None);
    }

    #[test]
    fn dates_are_rfc3339() {
        assert_eq!(rfc3339_at(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339_at(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339_at(1_796_000_000), "2026-11-30T00:53:20Z");
    }
}
