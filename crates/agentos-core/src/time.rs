//! Times as their readers see them: RFC 3339 in UTC with milliseconds.

/// RFC 3339 in UTC with milliseconds (`2026-12-01T04:05:06.007Z`). Years 0 to 9999 are written
/// here by arithmetic (every read of the catalog writes two times per entry, and chrono's
/// formatter parses its pattern on each call); others, and what chrono cannot represent, as
/// chrono writes them (nothing for the latter).
pub fn format_time(ms: i64) -> String {
    // 0000-01-01T00:00:00.000Z and 9999-12-31T23:59:59.999Z.
    const FIRST: i64 = -62_167_219_200_000;
    const LAST: i64 = 253_402_300_799_999;
    if !(FIRST..=LAST).contains(&ms) {
        return chrono::DateTime::from_timestamp_millis(ms)
            .map(|t| t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string())
            .unwrap_or_default();
    }
    let (secs, milli) = (ms.div_euclid(1000), ms.rem_euclid(1000));
    let (days, of_day) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    let mut out = [0u8; 24];
    let mut put = |at: usize, value: i64, width: usize| {
        let mut v = value;
        for i in (0..width).rev() {
            out[at + i] = b'0' + (v % 10) as u8;
            v /= 10;
        }
    };
    put(0, y, 4);
    put(5, m, 2);
    put(8, d, 2);
    put(11, of_day / 3600, 2);
    put(14, of_day % 3600 / 60, 2);
    put(17, of_day % 60, 2);
    put(20, milli, 3);
    for (at, c) in [(4, b'-'), (7, b'-'), (10, b'T'), (13, b':'), (16, b':'), (19, b'.'), (23, b'Z')] {
        out[at] = c;
    }
    String::from_utf8(out.to_vec()).expect("ASCII digits and separators")
}

/// The proleptic Gregorian (year, month, day) of a count of days since 1970-01-01
/// (H. Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn by_chrono(ms: i64) -> String {
        chrono::DateTime::from_timestamp_millis(ms)
            .map(|t| t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string())
            .unwrap_or_default()
    }

    #[test]
    fn times_are_written_as_chrono_writes_them() {
        assert_eq!(format_time(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(format_time(1_796_097_906_007), "2026-12-01T04:05:06.007Z");
        assert_eq!(format_time(-1), "1969-12-31T23:59:59.999Z");
        let edges = [-62_167_219_200_001, -62_167_219_200_000, 253_402_300_799_999, 253_402_300_800_000];
        let leap_days = [951_782_400_000, 4_107_542_400_000, -2_203_891_200_000];
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let random = (0..200_000).map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % (2 * 253_402_300_800_000)) as i64 - 253_402_300_800_000
        });
        for ms in edges.into_iter().chain(leap_days).chain(random).chain([i64::MIN, i64::MAX]) {
            assert_eq!(format_time(ms), by_chrono(ms), "{ms}");
        }
    }
}
