//! When a scheduled input is delivered (`docs/executions.md`, "Scheduled inputs"; REFERENCE 9):
//! the one reading of an input's `deliver_at` / `deliver_in`, shared by the HTTP and gRPC input
//! doors and the `send` kernel tool, so they refuse alike.
//!
//! `deliver_at` is an ISO 8601 / RFC 3339 date-time that carries its offset
//! (`2026-12-02T09:30:00Z`, `2026-12-02T10:30:00.250+01:00`); `deliver_in` is a positive whole
//! count of seconds, minutes, hours or days (`90s`, `20m`, `2h`, `1d`). Either resolves, on the
//! fabric clock, to Unix milliseconds. Owns no state: the hold itself is the store's
//! ([`crate::store::Store::admit_to_conversation`]) and the timer Root's
//! ([`crate::actors::root::RootHandle::schedule_delivery`]).

use nexus_proto::{DeliveryMode, ErrorCode, Refusal};

/// How far in the past a `deliver_at` may lie and still be taken (delivered at once), in
/// milliseconds: 2 minutes (REFERENCE 9, `deliver_at_in_past`). It forgives clock skew between a
/// client and the server.
pub const PAST_GRACE_MS: i64 = 2 * 60 * 1_000;

/// How far ahead a delivery may be, in milliseconds: 10 years, counted as 3,653 days (ten years
/// hold at most three leap days). Beyond it: `deliver_at_too_far` (REFERENCE 9).
pub const AHEAD_BOUND_MS: i64 = 3_653 * DAY_MS;

const SECOND_MS: i64 = 1_000;
const MINUTE_MS: i64 = 60 * SECOND_MS;
const HOUR_MS: i64 = 60 * MINUTE_MS;
const DAY_MS: i64 = 24 * HOUR_MS;

/// Resolves an input's delivery time, in Unix milliseconds, at `now_ms` (the fabric clock):
/// `None` when neither field is given (delivered at once). A `deliver_at` up to
/// [`PAST_GRACE_MS`] in the past resolves to itself, and the input is delivered at once.
///
/// # Errors
/// 422 `deliver_at_ambiguous` when both fields are given; 422 `deliver_at_not_steerable` with
/// `delivery_mode` `steer`; 422 `validation_failed` for a `deliver_at` that is no date-time with
/// an offset, or a `deliver_in` that is not `<n>s|m|h|d` with a positive whole `n`; 422
/// `deliver_at_in_past` more than 2 minutes in the past; 422 `deliver_at_too_far` more than 10
/// years ahead.
pub fn delivery_time(
    now_ms: i64,
    deliver_at: Option<&str>,
    deliver_in: Option<&str>,
    mode: DeliveryMode,
) -> Result<Option<i64>, Refusal> {
    let at = match (deliver_at, deliver_in) {
        (None, None) => return Ok(None),
        (Some(_), Some(_)) => {
            return Err(Refusal::new(
                ErrorCode::DeliverAtAmbiguous,
                "deliver_at and deliver_in were both given; send one of them",
            ));
        }
        _ if mode == DeliveryMode::Steer => {
            return Err(Refusal::new(
                ErrorCode::DeliverAtNotSteerable,
                "a steer goes into the running turn now and cannot be scheduled; drop deliver_at/deliver_in, \
                 or send it with delivery_mode queue",
            ));
        }
        (Some(at), None) => parse_deliver_at(at)?,
        (None, Some(within)) => match parse_deliver_in(within)? {
            Some(within) if within <= AHEAD_BOUND_MS => now_ms.saturating_add(within),
            _ => return Err(too_far("deliver_in")),
        },
    };
    if at < now_ms.saturating_sub(PAST_GRACE_MS) {
        return Err(Refusal::new(
            ErrorCode::DeliverAtInPast,
            format!(
                "deliver_at is {} s in the past (at most 120 s is taken); send a time to come, or no deliver_at to \
                 deliver it now",
                (now_ms - at) / SECOND_MS
            ),
        ));
    }
    if at > now_ms.saturating_add(AHEAD_BOUND_MS) {
        return Err(too_far("deliver_at"));
    }
    Ok(Some(at))
}

fn too_far(field: &str) -> Refusal {
    Refusal::new(
        ErrorCode::DeliverAtTooFar,
        format!("{field} is more than 10 years (3653 days) ahead; schedule it sooner"),
    )
}

fn invalid(message: String) -> Refusal {
    Refusal::new(ErrorCode::ValidationFailed, message)
}

/// Reads `deliver_in`: `<n><unit>`, `n` a positive whole number, `unit` `s`, `m`, `h` or `d`.
/// Answers the milliseconds, or `None` when `n` is too large to count (beyond any bound).
///
/// # Errors
/// 422 `validation_failed` for anything else.
pub fn parse_deliver_in(text: &str) -> Result<Option<i64>, Refusal> {
    let bad = || {
        invalid(format!(
            "deliver_in: {} is no duration; use a positive whole number and a unit, s, m, h or d (90s, 20m, 2h, 1d)",
            crate::json::echo(text)
        ))
    };
    let unit = match text.as_bytes().last() {
        Some(b's') => SECOND_MS,
        Some(b'm') => MINUTE_MS,
        Some(b'h') => HOUR_MS,
        Some(b'd') => DAY_MS,
        _ => return Err(bad()),
    };
    let digits = &text[..text.len() - 1];
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    match digits.parse::<i64>() {
        Ok(0) => Err(bad()),
        Ok(count) => Ok(count.checked_mul(unit)),
        // Only digits, so only too many of them.
        Err(_) => Ok(None),
    }
}

/// Reads `deliver_at`: `YYYY-MM-DDTHH:MM[:SS[.fraction]]` then `Z` or an offset `±HH:MM`
/// (`±HHMM` and `±HH` too); `t`, `z` and a space in place of `T` are taken, as RFC 3339 allows.
/// Answers Unix milliseconds (a fraction finer than a millisecond is dropped).
///
/// # Errors
/// 422 `validation_failed`, saying what is wrong: no offset (the time would be ambiguous), or no
/// valid date-time.
pub fn parse_deliver_at(text: &str) -> Result<i64, Refusal> {
    let bad = |why: &str| {
        invalid(format!(
            "deliver_at: {} {why}; send an ISO 8601 date-time with its offset, like 2026-12-02T09:30:00Z or \
             2026-12-02T10:30:00+01:00",
            crate::json::echo(text)
        ))
    };
    let bytes = text.as_bytes();
    let number = |from: usize, len: usize| -> Option<i64> {
        let part = bytes.get(from..from + len)?;
        part.iter().all(u8::is_ascii_digit).then(|| part.iter().fold(0, |n, d| n * 10 + i64::from(d - b'0')))
    };
    let date = (|| {
        let year = number(0, 4)?;
        (bytes.get(4) == Some(&b'-')).then_some(())?;
        let month = number(5, 2)?;
        (bytes.get(7) == Some(&b'-')).then_some(())?;
        Some((year, month, number(8, 2)?))
    })();
    let Some((year, month, day)) = date else { return Err(bad("is no date-time (YYYY-MM-DD first)")) };
    if !(1..=12).contains(&month) || day < 1 || day > days_in_month(year, month) {
        return Err(bad("names no calendar day"));
    }
    if !matches!(bytes.get(10), Some(b'T' | b't' | b' ')) {
        return Err(bad("has no time of day (THH:MM after the date)"));
    }
    let (Some(hour), Some(b':'), Some(minute)) = (number(11, 2), bytes.get(13), number(14, 2)) else {
        return Err(bad("has no time of day (THH:MM after the date)"));
    };
    let mut at = 16;
    let mut second = 0;
    let mut millis = 0;
    if bytes.get(at) == Some(&b':') {
        second = number(at + 1, 2).ok_or_else(|| bad("has a malformed seconds field"))?;
        at += 3;
        if matches!(bytes.get(at), Some(b'.' | b',')) {
            let digits = bytes[at + 1..].iter().take_while(|b| b.is_ascii_digit()).count();
            if digits == 0 {
                return Err(bad("has a malformed fraction of a second"));
            }
            millis = bytes[at + 1..at + 1 + digits.min(3)].iter().fold(0, |n, d| n * 10 + i64::from(d - b'0'))
                * 10_i64.pow(3 - u32::try_from(digits.min(3)).unwrap_or(3));
            at += 1 + digits;
        }
    }
    if hour > 23 || minute > 59 || second > 59 {
        return Err(bad("names no time of day"));
    }
    let offset_minutes = match &bytes[at..] {
        [] => return Err(bad("has no offset, so its instant is ambiguous; add Z or ±HH:MM")),
        [b'Z' | b'z'] => 0,
        [sign @ (b'+' | b'-'), rest @ ..] => {
            let parsed = match rest {
                [_, _] => number(at + 1, 2).map(|h| (h, 0)),
                [_, _, b':', _, _] => number(at + 1, 2).zip(number(at + 4, 2)),
                [_, _, _, _] => number(at + 1, 2).zip(number(at + 3, 2)),
                _ => None,
            };
            let Some((hours, minutes)) = parsed.filter(|(h, m)| *h <= 23 && *m <= 59) else {
                return Err(bad("has a malformed offset (use Z or ±HH:MM)"));
            };
            let minutes = hours * 60 + minutes;
            if *sign == b'-' { -minutes } else { minutes }
        }
        _ => return Err(bad("has something after its time that is no offset (use Z or ±HH:MM)")),
    };
    let days = days_from_civil(year, month, day);
    let local = days * DAY_MS + hour * HOUR_MS + minute * MINUTE_MS + second * SECOND_MS + millis;
    Ok(local - offset_minutes * MINUTE_MS)
}

fn is_leap(year: i64) -> bool {
    (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's `days_from_civil`).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let month_from_march = (month + 9) % 12;
    let day_of_year = (153 * month_from_march + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_764_667_200_000; // 2025-12-02T09:20:00Z

    #[test]
    fn deliver_at_reads_iso_8601_with_its_offset() {
        let cases = [
            ("1970-01-01T00:00:00Z", 0),
            ("2025-12-02T09:20:00Z", NOW),
            ("2025-12-02T09:20:00.250Z", NOW + 250),
            ("2025-12-02T09:20:00.2509Z", NOW + 250),
            ("2025-12-02T09:20:00.5z", NOW + 500),
            ("2025-12-02t10:20:00+01:00", NOW),
            ("2025-12-02 04:20:00-05:00", NOW),
            ("2025-12-02T10:50+0130", NOW),
            ("2025-12-02T11:20:00+02", NOW),
            ("2024-02-29T00:00:00Z", 1_709_164_800_000),
            ("2000-03-01T00:00:00Z", 951_868_800_000),
        ];
        for (text, want) in cases {
            assert_eq!(parse_deliver_at(text).map_err(|r| r.message), Ok(want), "{text}");
        }
        for text in [
            "2025-12-02T09:20:00",
            "2025-12-02",
            "2025-13-02T09:20:00Z",
            "2025-02-29T09:20:00Z",
            "2025-12-02T24:00:00Z",
            "2025-12-02T09:20:00+1:00",
            "2025-12-02T09:20:00 Z",
            "2025-12-02T09:20:00.Z",
            "20251202T092000Z",
            "tomorrow",
            "",
        ] {
            let refusal = parse_deliver_at(text).expect_err(text);
            assert_eq!(refusal.code, ErrorCode::ValidationFailed, "{text}");
        }
        let no_offset = parse_deliver_at("2025-12-02T09:20:00").expect_err("no offset");
        assert!(no_offset.message.contains("offset"), "{}", no_offset.message);
    }

    #[test]
    fn deliver_in_reads_a_positive_count_and_a_unit() {
        let cases = [("90s", 90_000), ("20m", 1_200_000), ("2h", 7_200_000), ("1d", DAY_MS), ("007m", 420_000)];
        for (text, want) in cases {
            assert_eq!(parse_deliver_in(text).map_err(|r| r.message), Ok(Some(want)), "{text}");
        }
        assert_eq!(parse_deliver_in("99999999999999999999d").map_err(|r| r.code), Ok(None));
        assert_eq!(parse_deliver_in("9999999999999999d").map_err(|r| r.code), Ok(None), "overflows the product");
        for text in ["0s", "-5m", "+5m", "5", "m", "5w", "1.5h", "5 m", " 5m", "5M", ""] {
            assert_eq!(parse_deliver_in(text).map_err(|r| r.code), Err(ErrorCode::ValidationFailed), "{text}");
        }
    }

    #[test]
    fn every_refusal_word_of_reference_9() {
        let queue = DeliveryMode::Queue;
        let code = |result: Result<Option<i64>, Refusal>| result.map_err(|r| r.code);
        assert_eq!(code(delivery_time(NOW, None, None, queue)), Ok(None));
        assert_eq!(code(delivery_time(NOW, None, None, DeliveryMode::Steer)), Ok(None));
        assert_eq!(code(delivery_time(NOW, None, Some("20m"), queue)), Ok(Some(NOW + 20 * MINUTE_MS)));
        assert_eq!(
            code(delivery_time(NOW, Some("2025-12-02T09:20:00Z"), Some("20m"), queue)),
            Err(ErrorCode::DeliverAtAmbiguous)
        );
        assert_eq!(
            code(delivery_time(NOW, None, Some("20m"), DeliveryMode::Steer)),
            Err(ErrorCode::DeliverAtNotSteerable)
        );
        assert_eq!(
            code(delivery_time(NOW, Some("2025-12-02T09:30:00Z"), None, DeliveryMode::Steer)),
            Err(ErrorCode::DeliverAtNotSteerable)
        );
        // Two minutes of grace for skew, then refused.
        assert_eq!(code(delivery_time(NOW, Some("2025-12-02T09:18:00Z"), None, queue)), Ok(Some(NOW - 2 * MINUTE_MS)));
        assert_eq!(
            code(delivery_time(NOW, Some("2025-12-02T09:17:59.999Z"), None, queue)),
            Err(ErrorCode::DeliverAtInPast)
        );
        // Ten years ahead is the bound, in both fields.
        assert_eq!(code(delivery_time(NOW, None, Some("3653d"), queue)), Ok(Some(NOW + AHEAD_BOUND_MS)));
        assert_eq!(code(delivery_time(NOW, None, Some("3654d"), queue)), Err(ErrorCode::DeliverAtTooFar));
        assert_eq!(
            code(delivery_time(NOW, None, Some("99999999999999999999s"), queue)),
            Err(ErrorCode::DeliverAtTooFar)
        );
        assert_eq!(code(delivery_time(NOW, Some("2035-12-03T09:20:00Z"), None, queue)), Ok(Some(NOW + AHEAD_BOUND_MS)));
        assert_eq!(
            code(delivery_time(NOW, Some("2035-12-04T09:20:00Z"), None, queue)),
            Err(ErrorCode::DeliverAtTooFar)
        );
        assert_eq!(
            code(delivery_time(NOW, Some("2025-12-02T09:20:00"), None, queue)),
            Err(ErrorCode::ValidationFailed)
        );
    }
}
