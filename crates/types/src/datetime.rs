//! Calendar arithmetic and the text forms of `timestamp`, `date`, `time` and `duration`
//! that CQL accepts, shared by literal typing (parser side) and value formatting.
//!
//! Everything is proleptic Gregorian in UTC (Cassandra parses zone-less timestamps in the
//! server's zone; a server-side database has no business depending on its host's zone).

use std::fmt::Write as _;

/// Milliseconds per day.
pub const MS_PER_DAY: i64 = 86_400_000;
/// Nanoseconds per day: the exclusive upper bound of a `time` value.
pub const NANOS_PER_DAY: i64 = 86_400_000_000_000;
/// The serialized `date` of 1970-01-01 (dates are unsigned days offset by 2^31).
pub const DATE_EPOCH: u32 = 1 << 31;

/// Days since 1970-01-01 of a civil date (month 1..=12, day 1..=31; not range-checked).
pub fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(month);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The civil date `(year, month, day)` of a day count since 1970-01-01.
pub fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

fn days_in_month(year: i64, month: u32) -> u32 {
    match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        _ => {
            if (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 {
                29
            } else {
                28
            }
        }
    }
}

/// A tiny cursor over ASCII text for the fixed-shape parsers below.
struct Cursor<'a> {
    s: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn new(s: &'a str) -> Self {
        Cursor {
            s: s.as_bytes(),
            pos: 0,
        }
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.pos).copied()
    }

    fn eat(&mut self, c: u8) -> bool {
        if self.peek() == Some(c) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    /// Reads `min..=max` decimal digits; returns the value and the digit count.
    fn digits(&mut self, min: usize, max: usize) -> Option<(i64, usize)> {
        let start = self.pos;
        let mut v: i64 = 0;
        while self.pos - start < max {
            match self.peek() {
                Some(c @ b'0'..=b'9') => {
                    v = v.checked_mul(10)?.checked_add(i64::from(c - b'0'))?;
                    self.pos += 1;
                }
                _ => break,
            }
        }
        let n = self.pos - start;
        (n >= min).then_some((v, n))
    }

    fn done(&self) -> bool {
        self.pos == self.s.len()
    }
}

/// Parses `[-]yyyy-mm-dd` into days since the epoch, checking the calendar.
fn parse_civil(c: &mut Cursor<'_>) -> Option<i64> {
    let neg = c.eat(b'-');
    let (y, _) = c.digits(1, 9)?;
    let y = if neg { -y } else { y };
    if !c.eat(b'-') {
        return None;
    }
    let (m, _) = c.digits(1, 2)?;
    if !c.eat(b'-') {
        return None;
    }
    let (d, _) = c.digits(1, 2)?;
    let (m, d) = (u32::try_from(m).ok()?, u32::try_from(d).ok()?);
    if !(1..=12).contains(&m) || d == 0 || d > days_in_month(y, m) {
        return None;
    }
    Some(days_from_civil(y, m, d))
}

/// Parses `hh:mm[:ss[.f{1,9}]]` into nanoseconds since midnight.
fn parse_clock(c: &mut Cursor<'_>, allow_no_seconds: bool) -> Option<i64> {
    let (h, _) = c.digits(1, 2)?;
    if !c.eat(b':') {
        return None;
    }
    let (mi, _) = c.digits(1, 2)?;
    let mut s = 0;
    let mut nanos = 0;
    if c.eat(b':') {
        s = c.digits(1, 2)?.0;
        if c.eat(b'.') {
            let (f, n) = c.digits(1, 9)?;
            nanos = f * 10i64.pow(9 - n as u32);
        }
    } else if !allow_no_seconds {
        return None;
    }
    if h > 23 || mi > 59 || s > 59 {
        return None;
    }
    Some(((h * 60 + mi) * 60 + s) * 1_000_000_000 + nanos)
}

/// Parses a zone suffix: `Z`, `z`, `+hh`, `+hhmm`, `+hh:mm`, `-...`, or nothing (UTC).
/// Returns the offset in minutes.
fn parse_zone(c: &mut Cursor<'_>) -> Option<i64> {
    if c.done() {
        return Some(0);
    }
    c.eat(b' ');
    if c.eat(b'Z') || c.eat(b'z') {
        return Some(0);
    }
    let sign = if c.eat(b'+') {
        1
    } else if c.eat(b'-') {
        -1
    } else if c.s[c.pos..].eq_ignore_ascii_case(b"utc") || c.s[c.pos..].eq_ignore_ascii_case(b"gmt")
    {
        c.pos = c.s.len();
        return Some(0);
    } else {
        return None;
    };
    let (h, _) = c.digits(2, 2)?;
    c.eat(b':');
    let m = if c.done() { 0 } else { c.digits(2, 2)?.0 };
    if h > 18 || m > 59 {
        return None;
    }
    Some(sign * (h * 60 + m))
}

/// Parses a `timestamp` string as Cassandra accepts it: an integer (ms since the epoch),
/// or `yyyy-mm-dd[( |T)hh:mm[:ss[.fff]]][zone]` with zone `Z`, `+hhmm`, `+hh:mm` or `+hh`
/// (absent zone = UTC). Returns milliseconds since the epoch; fractions beyond ms truncate.
pub fn parse_timestamp(text: &str) -> Option<i64> {
    let text = text.trim();
    if let Ok(ms) = text.parse::<i64>() {
        return Some(ms);
    }
    let mut c = Cursor::new(text);
    let days = parse_civil(&mut c)?;
    let mut nanos = 0;
    if c.eat(b'T')
        || c.eat(b't')
        || (c.peek() == Some(b' ') && {
            // A space is either the date/time separator or the start of a zone.
            let next = c.s.get(c.pos + 1).copied();
            matches!(next, Some(b'0'..=b'9'))
        })
    {
        if c.peek() == Some(b' ') {
            c.pos += 1;
        }
        nanos = parse_clock(&mut c, true)?;
    }
    let zone = parse_zone(&mut c)?;
    if !c.done() {
        return None;
    }
    days.checked_mul(MS_PER_DAY)?
        .checked_add(nanos / 1_000_000)?
        .checked_sub(zone * 60_000)
}

/// Parses a `date` string: `[-]yyyy-mm-dd`, or an unsigned integer that is already the
/// serialized form (days offset by 2^31). Returns the serialized `u32`.
pub fn parse_date(text: &str) -> Option<u32> {
    let text = text.trim();
    if text.bytes().all(|b| b.is_ascii_digit()) && !text.is_empty() {
        return text.parse::<u32>().ok();
    }
    let mut c = Cursor::new(text);
    let days = parse_civil(&mut c)?;
    if !c.done() {
        return None;
    }
    days_to_date(days)
}

/// The serialized `date` of a day count since the epoch, if it is in range.
pub fn days_to_date(days: i64) -> Option<u32> {
    u32::try_from(days.checked_add(i64::from(DATE_EPOCH))?).ok()
}

/// Parses a `time` string: `hh:mm:ss[.fffffffff]`, or an integer of nanoseconds since
/// midnight. Returns nanoseconds, always in `0..NANOS_PER_DAY`.
pub fn parse_time(text: &str) -> Option<i64> {
    let text = text.trim();
    if let Ok(n) = text.parse::<i64>() {
        return (0..NANOS_PER_DAY).contains(&n).then_some(n);
    }
    let mut c = Cursor::new(text);
    let n = parse_clock(&mut c, false)?;
    c.done().then_some(n)
}

/// Writes a timestamp as ISO-8601 UTC with milliseconds: `2024-01-02T03:04:05.123Z`.
/// Years outside 0..=9999 are written with their sign and full width.
pub fn write_timestamp(ms: i64, out: &mut String) {
    let days = ms.div_euclid(MS_PER_DAY);
    let rem = ms.rem_euclid(MS_PER_DAY);
    let (y, m, d) = civil_from_days(days);
    write_civil(y, m, d, out);
    let secs = rem / 1000;
    let _ = write!(
        out,
        "T{:02}:{:02}:{:02}.{:03}Z",
        secs / 3600,
        secs / 60 % 60,
        secs % 60,
        rem % 1000
    );
}

fn write_civil(y: i64, m: u32, d: u32, out: &mut String) {
    if (0..=9999).contains(&y) {
        let _ = write!(out, "{y:04}-{m:02}-{d:02}");
    } else {
        let _ = write!(out, "{y}-{m:02}-{d:02}");
    }
}

/// Writes a serialized `date` as `yyyy-mm-dd`.
pub fn write_date(date: u32, out: &mut String) {
    let (y, m, d) = civil_from_days(i64::from(date) - i64::from(DATE_EPOCH));
    write_civil(y, m, d, out);
}

/// Writes a `time` (ns since midnight) as `hh:mm:ss.nnnnnnnnn`.
pub fn write_time(nanos: i64, out: &mut String) {
    let secs = nanos.div_euclid(1_000_000_000);
    let frac = nanos.rem_euclid(1_000_000_000);
    let _ = write!(
        out,
        "{:02}:{:02}:{:02}.{:09}",
        secs / 3600,
        secs / 60 % 60,
        secs % 60,
        frac
    );
}

/// A CQL `duration`: months, days and nanoseconds, all of the same sign.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Duration {
    /// Months.
    pub months: i32,
    /// Days.
    pub days: i32,
    /// Nanoseconds.
    pub nanos: i64,
}

const NS_HOUR: i64 = 3_600_000_000_000;
const NS_MINUTE: i64 = 60_000_000_000;
const NS_SECOND: i64 = 1_000_000_000;
const NS_MILLI: i64 = 1_000_000;
const NS_MICRO: i64 = 1_000;

/// Accumulates duration components with overflow checks.
#[derive(Default)]
struct DurationBuilder {
    months: i64,
    days: i64,
    nanos: i64,
}

impl DurationBuilder {
    fn add(&mut self, n: i64, unit: &str) -> Option<()> {
        let u = unit.to_ascii_lowercase();
        match u.as_str() {
            "y" => self.months = self.months.checked_add(n.checked_mul(12)?)?,
            "mo" => self.months = self.months.checked_add(n)?,
            "w" => self.days = self.days.checked_add(n.checked_mul(7)?)?,
            "d" => self.days = self.days.checked_add(n)?,
            "h" => self.nanos = self.nanos.checked_add(n.checked_mul(NS_HOUR)?)?,
            "m" => self.nanos = self.nanos.checked_add(n.checked_mul(NS_MINUTE)?)?,
            "s" => self.nanos = self.nanos.checked_add(n.checked_mul(NS_SECOND)?)?,
            "ms" => self.nanos = self.nanos.checked_add(n.checked_mul(NS_MILLI)?)?,
            "us" | "µs" => self.nanos = self.nanos.checked_add(n.checked_mul(NS_MICRO)?)?,
            "ns" => self.nanos = self.nanos.checked_add(n)?,
            _ => return None,
        }
        Some(())
    }

    fn finish(self, negative: bool) -> Option<Duration> {
        let sign = if negative { -1 } else { 1 };
        Some(Duration {
            months: i32::try_from(self.months * sign).ok()?,
            days: i32::try_from(self.days * sign).ok()?,
            nanos: self.nanos.checked_mul(sign)?,
        })
    }
}

/// Parses a duration literal: `1h30m`, `-2d10ms`, `1y2mo`, `3µs` (units y, mo, w, d, h, m,
/// s, ms, us/µs, ns, case-insensitive), ISO-8601 `P1Y2M3DT4H5M6S` / `P2W`, or the ISO
/// alternative form `P0001-02-03T04:05:06`.
pub fn parse_duration(text: &str) -> Option<Duration> {
    let (negative, body) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    if body.is_empty() {
        return None;
    }
    let mut b = DurationBuilder::default();
    if let Some(iso) = body.strip_prefix(['P', 'p']) {
        if iso.contains('-') {
            parse_iso_alternative(iso, &mut b)?;
        } else {
            parse_iso(iso, &mut b)?;
        }
        return b.finish(negative);
    }
    let mut rest = body;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        let n: i64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_len = rest
            .char_indices()
            .find(|(_, c)| c.is_ascii_digit())
            .map_or(rest.len(), |(i, _)| i);
        if unit_len == 0 {
            return None;
        }
        b.add(n, &rest[..unit_len])?;
        rest = &rest[unit_len..];
    }
    b.finish(negative)
}

fn parse_iso(iso: &str, b: &mut DurationBuilder) -> Option<()> {
    let mut in_time = false;
    let mut rest = iso;
    let mut any = false;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix(['T', 't']) {
            if in_time {
                return None;
            }
            in_time = true;
            rest = r;
            continue;
        }
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 || digits == rest.len() {
            return None;
        }
        let n: i64 = rest[..digits].parse().ok()?;
        let unit = rest.as_bytes()[digits].to_ascii_uppercase();
        let unit = match (unit, in_time) {
            (b'Y', false) => "y",
            (b'M', false) => "mo",
            (b'W', false) => "w",
            (b'D', false) => "d",
            (b'H', true) => "h",
            (b'M', true) => "m",
            (b'S', true) => "s",
            _ => return None,
        };
        b.add(n, unit)?;
        any = true;
        rest = &rest[digits + 1..];
    }
    any.then_some(())
}

fn parse_iso_alternative(iso: &str, b: &mut DurationBuilder) -> Option<()> {
    let mut c = Cursor::new(iso);
    let (y, _) = c.digits(4, 4)?;
    let ok = c.eat(b'-');
    let (mo, _) = c.digits(2, 2)?;
    let ok = ok && c.eat(b'-');
    let (d, _) = c.digits(2, 2)?;
    let ok = ok && c.eat(b'T');
    let (h, _) = c.digits(2, 2)?;
    let ok = ok && c.eat(b':');
    let (mi, _) = c.digits(2, 2)?;
    let ok = ok && c.eat(b':');
    let (s, _) = c.digits(2, 2)?;
    if !ok || !c.done() {
        return None;
    }
    b.add(y, "y")?;
    b.add(mo, "mo")?;
    b.add(d, "d")?;
    b.add(h, "h")?;
    b.add(mi, "m")?;
    b.add(s, "s")
}

/// Writes a duration as Cassandra prints it (`1y2mo3d4h5m6s7ms8us9ns`, `-` prefix when
/// negative); the zero duration is written `0s` so that the output is a valid literal.
pub fn write_duration(d: Duration, out: &mut String) {
    if d.months < 0 || d.days < 0 || d.nanos < 0 {
        out.push('-');
    }
    let months = i64::from(d.months).unsigned_abs();
    let days = i64::from(d.days).unsigned_abs();
    let nanos = d.nanos.unsigned_abs();
    if months == 0 && days == 0 && nanos == 0 {
        out.push_str("0s");
        return;
    }
    let mut put = |v: u64, unit: &str| {
        if v != 0 {
            let _ = write!(out, "{v}{unit}");
        }
    };
    put(months / 12, "y");
    put(months % 12, "mo");
    put(days, "d");
    put(nanos / NS_HOUR as u64, "h");
    put(nanos % NS_HOUR as u64 / NS_MINUTE as u64, "m");
    put(nanos % NS_MINUTE as u64 / NS_SECOND as u64, "s");
    put(nanos % NS_SECOND as u64 / NS_MILLI as u64, "ms");
    put(nanos % NS_MILLI as u64 / NS_MICRO as u64, "us");
    put(nanos % NS_MICRO as u64, "ns");
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn parsers_never_panic(s in "\\PC{0,30}", t in "[-+PTYMWDHS0-9:. zZmousµn]{0,24}") {
            for text in [&s, &t] {
                let _ = parse_timestamp(text);
                let _ = parse_date(text);
                let _ = parse_time(text);
                if let Some(d) = parse_duration(text) {
                    // Whatever parses prints back to something that parses to the same value.
                    let mut out = String::new();
                    write_duration(d, &mut out);
                    prop_assert_eq!(parse_duration(&out), Some(d));
                }
            }
        }

        #[test]
        fn timestamps_round_trip(ms in -62_167_219_200_000i64..253_402_300_799_999) {
            let mut out = String::new();
            write_timestamp(ms, &mut out);
            prop_assert_eq!(parse_timestamp(&out), Some(ms));
        }
    }

    #[test]
    fn civil_round_trip() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(days_from_civil(1969, 12, 31), -1);
        for days in (-800_000..800_000).step_by(997) {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days);
        }
    }

    #[test]
    fn timestamps_parse_in_every_accepted_shape() {
        let base = 1_704_164_645_000; // 2024-01-02T03:04:05Z
        assert_eq!(parse_timestamp("2024-01-02 03:04:05+0000"), Some(base));
        assert_eq!(
            parse_timestamp("2024-01-02T03:04:05.123Z"),
            Some(base + 123)
        );
        assert_eq!(parse_timestamp("2024-01-02T03:04:05.1Z"), Some(base + 100));
        assert_eq!(parse_timestamp("2024-01-02 03:04:05"), Some(base));
        assert_eq!(parse_timestamp("2024-01-02 03:04"), Some(base - 5_000));
        assert_eq!(parse_timestamp("2024-01-02 05:04:05+02:00"), Some(base));
        assert_eq!(parse_timestamp("2024-01-02 01:04:05-02"), Some(base));
        assert_eq!(
            parse_timestamp("2024-01-02"),
            Some(base - 3 * 3_600_000 - 245_000)
        );
        assert_eq!(
            parse_timestamp("2024-01-02 03:04:05.123456+0000"),
            Some(base + 123)
        );
        assert_eq!(parse_timestamp("1234"), Some(1234));
        assert_eq!(parse_timestamp("-5"), Some(-5));
        for bad in [
            "2024-13-01",
            "2024-02-30",
            "2024-01-02X",
            "2024-01-02 25:00",
            "",
            "abc",
        ] {
            assert_eq!(parse_timestamp(bad), None, "{bad}");
        }
    }

    #[test]
    fn dates_and_times() {
        assert_eq!(parse_date("1970-01-01"), Some(DATE_EPOCH));
        assert_eq!(parse_date("1969-12-31"), Some(DATE_EPOCH - 1));
        assert_eq!(parse_date("2147483648"), Some(DATE_EPOCH));
        assert_eq!(parse_date("2024-02-29"), Some(DATE_EPOCH + 19_782));
        assert_eq!(parse_date("2023-02-29"), None);
        assert_eq!(parse_time("01:02:03"), Some(3_723_000_000_000));
        assert_eq!(parse_time("01:02:03.5"), Some(3_723_500_000_000));
        assert_eq!(parse_time("23:59:59.999999999"), Some(NANOS_PER_DAY - 1));
        assert_eq!(parse_time("86400000000000"), None);
        assert_eq!(parse_time("24:00:00"), None);
        let mut s = String::new();
        write_time(3_723_500_000_000, &mut s);
        assert_eq!(s, "01:02:03.500000000");
        s.clear();
        write_date(DATE_EPOCH + 19_782, &mut s);
        assert_eq!(s, "2024-02-29");
        s.clear();
        write_timestamp(1_704_164_645_123, &mut s);
        assert_eq!(s, "2024-01-02T03:04:05.123Z");
        assert_eq!(parse_timestamp(&s), Some(1_704_164_645_123));
        s.clear();
        write_timestamp(-1, &mut s);
        assert_eq!(s, "1969-12-31T23:59:59.999Z");
    }

    #[test]
    fn durations() {
        let d = |m, d, n| {
            Some(Duration {
                months: m,
                days: d,
                nanos: n,
            })
        };
        assert_eq!(parse_duration("1h30m"), d(0, 0, 90 * NS_MINUTE));
        assert_eq!(parse_duration("10ms"), d(0, 0, 10 * NS_MILLI));
        assert_eq!(parse_duration("1d"), d(0, 1, 0));
        assert_eq!(parse_duration("1y2mo3w4d"), d(14, 25, 0));
        assert_eq!(parse_duration("-3µs1ns"), d(0, 0, -3001));
        assert_eq!(parse_duration("P1DT2H"), d(0, 1, 2 * NS_HOUR));
        assert_eq!(parse_duration("P1Y2M"), d(14, 0, 0));
        assert_eq!(parse_duration("PT1M"), d(0, 0, NS_MINUTE));
        assert_eq!(parse_duration("P2W"), d(0, 14, 0));
        assert_eq!(
            parse_duration("P0001-02-03T04:05:06"),
            d(14, 3, 4 * NS_HOUR + 5 * NS_MINUTE + 6 * NS_SECOND)
        );
        for bad in [
            "",
            "-",
            "1",
            "h",
            "1x",
            "P",
            "PT",
            "P1H",
            "1h2",
            "99999999999999y",
        ] {
            assert_eq!(parse_duration(bad), None, "{bad}");
        }
        for text in ["1y2mo3d4h5m6s7ms8us9ns", "-10ms", "0s", "2d"] {
            let parsed = parse_duration(text).unwrap();
            let mut s = String::new();
            write_duration(parsed, &mut s);
            assert_eq!(s, text);
        }
    }
}
