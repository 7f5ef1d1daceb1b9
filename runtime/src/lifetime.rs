//! A sandbox's lifetime: how long it may run (`chalk.io/lifetime`) and what happens when that
//! time is up (`chalk.io/on-timeout`): it is destroyed, or suspended. Both are annotations of
//! the container's spec, so a fork (whose spec is its source's) inherits them. Pure rules;
//! the shim keeps the timer.

use std::time::Duration;

pub use chalk_labels::{EXPIRES_AT_LABEL, LIFETIME_ANNOTATION, ON_TIMEOUT_ANNOTATION};
use serde_json::Value;

/// The longest lifetime accepted: a year (longer is a typo, or means none).
const MAX: Duration = Duration::from_secs(366 * 24 * 3600);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnTimeout {
    /// The sandbox is killed and its task and container removed.
    Destroy,
    /// The sandbox is suspended (checkpointed, its compute released), to be resumed later.
    Suspend,
}

impl OnTimeout {
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "destroy" => Ok(OnTimeout::Destroy),
            "suspend" => Ok(OnTimeout::Suspend),
            other => Err(format!(
                "{ON_TIMEOUT_ANNOTATION} {other:?}: expected \"destroy\" or \"suspend\""
            )),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            OnTimeout::Destroy => "destroy",
            OnTimeout::Suspend => "suspend",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lifetime {
    pub duration: Duration,
    pub on_timeout: OnTimeout,
}

impl Lifetime {
    /// The lifetime a spec's annotations ask for; None without `chalk.io/lifetime`.
    pub fn of_spec(spec: &Value) -> Result<Option<Lifetime>, String> {
        let annotation = |k: &str| spec.get("annotations")?.get(k)?.as_str();
        let on_timeout = annotation(ON_TIMEOUT_ANNOTATION)
            .map(OnTimeout::parse)
            .transpose()?;
        let Some(text) = annotation(LIFETIME_ANNOTATION) else {
            return match on_timeout {
                Some(_) => Err(format!(
                    "{ON_TIMEOUT_ANNOTATION} is set without {LIFETIME_ANNOTATION}: say how long \
                     the sandbox may run"
                )),
                None => Ok(None),
            };
        };
        Ok(Some(Lifetime {
            duration: parse_duration(text)
                .map_err(|e| format!("{LIFETIME_ANNOTATION} {text:?}: {e}"))?,
            on_timeout: on_timeout.unwrap_or(OnTimeout::Destroy),
        }))
    }
}

/// Parses `90`, `90s`, `10m`, `2h`, `1d` or a sum of them (`1h30m`), at least one second.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err("empty duration".into());
    }
    if let Ok(secs) = text.parse::<u64>() {
        return checked(Duration::from_secs(secs));
    }
    let mut total = 0u64;
    let mut digits = String::new();
    for c in text.chars() {
        if c.is_ascii_digit() {
            digits.push(c);
            continue;
        }
        let unit = match c {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            'd' => 86400,
            _ => {
                return Err(format!(
                    "unknown unit {c:?}: use a number of seconds or s, m, h, d (e.g. 600s, 1h30m)"
                ))
            }
        };
        let n: u64 = digits
            .parse()
            .map_err(|_| format!("a number must come before {c:?} (e.g. 600s, 1h30m)"))?;
        digits.clear();
        total = total.saturating_add(n.saturating_mul(unit));
    }
    if !digits.is_empty() {
        return Err(format!(
            "{digits:?} has no unit: use s, m, h or d (e.g. 600s, 1h30m)"
        ));
    }
    checked(Duration::from_secs(total))
}

fn checked(d: Duration) -> Result<Duration, String> {
    if d < Duration::from_secs(1) {
        return Err("a lifetime must be at least 1s".into());
    }
    if d > MAX {
        return Err("a lifetime must be at most 366d".into());
    }
    Ok(d)
}

/// `d` as the shortest text [`parse_duration`] reads back (`1h30m`, `45s`).
pub fn format_duration(d: Duration) -> String {
    let mut secs = d.as_secs();
    if secs == 0 {
        return "0s".into();
    }
    let mut out = String::new();
    for (unit, name) in [(86400, 'd'), (3600, 'h'), (60, 'm'), (1, 's')] {
        if secs >= unit {
            out.push_str(&format!("{}{name}", secs / unit));
            secs %= unit;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn durations_read_as_people_write_them() {
        assert_eq!(parse_duration("600s"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("2d"), Ok(Duration::from_secs(172800)));
        for bad in ["", "0s", "10x", "m", "10m5", "400d", "-5s"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} was accepted");
        }
        for secs in [1, 59, 61, 3600, 5400, 90061] {
            let d = Duration::from_secs(secs);
            assert_eq!(parse_duration(&format_duration(d)), Ok(d));
        }
        assert_eq!(format_duration(Duration::from_secs(5400)), "1h30m");
    }

    #[test]
    fn lifetime_comes_from_the_annotations() {
        assert_eq!(Lifetime::of_spec(&json!({})), Ok(None));
        let spec = json!({"annotations": {LIFETIME_ANNOTATION: "10m"}});
        assert_eq!(
            Lifetime::of_spec(&spec),
            Ok(Some(Lifetime {
                duration: Duration::from_secs(600),
                on_timeout: OnTimeout::Destroy
            }))
        );
        let spec =
            json!({"annotations": {LIFETIME_ANNOTATION: "5s", ON_TIMEOUT_ANNOTATION: "suspend"}});
        assert_eq!(
            Lifetime::of_spec(&spec).unwrap().unwrap().on_timeout,
            OnTimeout::Suspend
        );
        let err = Lifetime::of_spec(&json!({"annotations": {ON_TIMEOUT_ANNOTATION: "pause"}}))
            .unwrap_err();
        assert!(err.contains("\"pause\""), "{err}");
        let err = Lifetime::of_spec(&json!({"annotations": {ON_TIMEOUT_ANNOTATION: "suspend"}}))
            .unwrap_err();
        assert!(err.contains("without"), "{err}");
        let err =
            Lifetime::of_spec(&json!({"annotations": {LIFETIME_ANNOTATION: "soon"}})).unwrap_err();
        assert!(err.contains(LIFETIME_ANNOTATION), "{err}");
    }
}
