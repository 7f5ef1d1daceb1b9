//! Times as chalk writes them in records and messages.

/// Now, RFC 3339 with milliseconds: it orders the registry and names records.
pub fn now() -> String {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let secs = chalk_runtime::snapshot::manifest::rfc3339_at(d.as_secs());
    format!("{}.{:03}Z", secs.trim_end_matches('Z'), d.subsec_millis())
}

/// Seconds since the epoch, now.
pub fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// `d` as `12.3s`, for messages.
pub fn seconds(d: std::time::Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}
