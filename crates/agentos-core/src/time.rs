//! Times as their readers see them: RFC 3339 in UTC with milliseconds.

/// RFC 3339 in UTC with milliseconds.
pub fn format_time(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string())
        .unwrap_or_default()
}
