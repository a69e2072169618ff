//! Sizes and durations as users write them.

use crate::CoreError;

/// Parse a memory size: `512M`, `4G`, `1.5G`, `100000` (bytes), `64MiB`, `2GB`. Units are binary.
pub fn parse_size(input: &str) -> Result<u64, CoreError> {
    let bad = || CoreError::BadSize { input: input.to_string() };
    let s = input.trim();
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    if num.is_empty() {
        return Err(bad());
    }
    let value: f64 = num.parse().map_err(|_| bad())?;
    let mult: u64 = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 1,
        "K" | "KB" | "KIB" => 1 << 10,
        "M" | "MB" | "MIB" => 1 << 20,
        "G" | "GB" | "GIB" => 1 << 30,
        "T" | "TB" | "TIB" => 1 << 40,
        _ => return Err(bad()),
    };
    let bytes = value * mult as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
        return Err(bad());
    }
    Ok(bytes.round() as u64)
}

/// Format bytes for humans: `512M`, `1.5G`.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [(&str, u64); 4] = [("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)];
    for (name, size) in UNITS {
        if bytes >= size {
            let v = bytes as f64 / size as f64;
            return if (v - v.round()).abs() < 0.05 {
                format!("{}{name}", v.round() as u64)
            } else {
                format!("{v:.1}{name}")
            };
        }
    }
    format!("{bytes}B")
}

/// Parse a walltime: `SECONDS`, `MM:SS`, `HH:MM:SS`, `D-HH:MM:SS`, or `90s`/`10m`/`2h`/`1d`.
pub fn parse_duration_secs(input: &str) -> Result<u64, CoreError> {
    let bad = || CoreError::BadDuration { input: input.to_string() };
    let s = input.trim();
    if s.is_empty() {
        return Err(bad());
    }
    if let Some(unit) = s.chars().last().filter(|c| c.is_ascii_alphabetic()) {
        let n: u64 = s[..s.len() - 1].trim().parse().map_err(|_| bad())?;
        let mult = match unit.to_ascii_lowercase() {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            'd' => 86400,
            _ => return Err(bad()),
        };
        return n.checked_mul(mult).ok_or_else(bad);
    }
    let (days, rest) = match s.split_once('-') {
        Some((d, r)) => (d.parse::<u64>().map_err(|_| bad())?, r),
        None => (0, s),
    };
    let parts: Vec<u64> = rest.split(':').map(|p| p.parse::<u64>().map_err(|_| bad())).collect::<Result<_, _>>()?;
    // Checked: a walltime beyond u64 seconds is an error, not a panic or a wrapped value.
    let secs = match parts.as_slice() {
        [s] => Some(*s),
        [m, s] => m.checked_mul(60).and_then(|m| m.checked_add(*s)),
        [h, m, s] => h.checked_mul(3600).and_then(|h| h.checked_add(m.checked_mul(60)?)?.checked_add(*s)),
        _ => None,
    };
    secs.and_then(|secs| days.checked_mul(86400)?.checked_add(secs)).ok_or_else(bad)
}

/// Format seconds as `[D-]HH:MM:SS`.
pub fn format_duration(secs: u64) -> String {
    let (d, rem) = (secs / 86400, secs % 86400);
    let (h, m, s) = (rem / 3600, (rem % 3600) / 60, rem % 60);
    if d > 0 {
        format!("{d}-{h:02}:{m:02}:{s:02}")
    } else {
        format!("{h:02}:{m:02}:{s:02}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("512M").unwrap(), 512 << 20);
        assert_eq!(parse_size("4g").unwrap(), 4 << 30);
        assert_eq!(parse_size("1.5G").unwrap(), 3 << 29);
        assert_eq!(parse_size("100").unwrap(), 100);
        assert_eq!(parse_size("64MiB").unwrap(), 64 << 20);
        assert!(parse_size("lots").is_err());
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("").is_err());
        assert_eq!(format_size(512 << 20), "512M");
        assert_eq!(format_size(3 << 29), "1.5G");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration_secs("90").unwrap(), 90);
        assert_eq!(parse_duration_secs("1:30").unwrap(), 90);
        assert_eq!(parse_duration_secs("01:00:05").unwrap(), 3605);
        assert_eq!(parse_duration_secs("2-00:00:00").unwrap(), 172800);
        assert_eq!(parse_duration_secs("10m").unwrap(), 600);
        assert_eq!(parse_duration_secs("2h").unwrap(), 7200);
        assert!(parse_duration_secs("soon").is_err());
        assert!(parse_duration_secs("1:2:3:4").is_err());
        assert_eq!(format_duration(3605), "01:00:05");
        assert_eq!(format_duration(90061), "1-01:01:01");
    }
}
