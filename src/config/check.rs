//! Range checks of numeric keys, and finding the line a key is written on.

use super::ConfigError;

/// No upper bound for [`check_range`].
pub(super) const UNBOUNDED: u64 = u64::MAX;
/// One hour, the upper bound of most intervals and timeouts, in ms.
pub(super) const HOUR_MS: u64 = 3_600_000;

/// `min <= value <= max` (`max` [`UNBOUNDED`]: no upper bound), else [`ConfigError::OutOfRange`]
/// naming `key` (the line is filled in by [`Config::from_toml_str`](super::Config::from_toml_str)).
pub(super) fn check_range(key: &str, value: u64, min: u64, max: u64) -> Result<(), ConfigError> {
    if (min..=max).contains(&value) {
        return Ok(());
    }
    let expected = if max == UNBOUNDED {
        format!("at least {min}")
    } else {
        format!("between {min} and {max}")
    };
    Err(ConfigError::OutOfRange {
        key: key.to_string(),
        value,
        expected,
        line: None,
    })
}

/// [`check_range`] over `(key, value, min, max)` rows, in order.
pub(super) fn check_ranges(rows: &[(&str, u64, u64, u64)]) -> Result<(), ConfigError> {
    rows.iter()
        .try_for_each(|&(key, value, min, max)| check_range(key, value, min, max))
}

/// The 1-based line where `key` (`section.field` or `upstream[i].field`) is assigned as
/// `field = ...` under its `[section]` (the i-th `[[upstream]]`) header, if it is.
pub(super) fn line_of(text: &str, key: &str) -> Option<usize> {
    let (section, field) = key.rsplit_once('.')?;
    let (name, index) = match section.split_once('[') {
        Some((name, rest)) => (name, rest.trim_end_matches(']').parse::<usize>().ok()?),
        None => (section, 0),
    };
    let (mut inside, mut seen) = (false, 0);
    for (n, line) in text.lines().enumerate() {
        let t = line.trim_start();
        if t.starts_with('[') {
            let header = t.split('#').next().unwrap_or_default().trim();
            let header = header.trim_matches(|c| c == '[' || c == ']').trim();
            inside = header == name && seen == index;
            seen += usize::from(header == name);
        } else if inside {
            let rest = t.strip_prefix(field).map(str::trim_start);
            if rest.is_some_and(|r| r.starts_with('=')) {
                return Some(n + 1);
            }
        }
    }
    None
}
