//! Formatting for people: `ls` lines, sizes, dates (UTC), health verdicts.

use sluice_client::{FileKind, FileStatus, Health};
use sluice_common::config::units::human_bytes;

/// A size: exact bytes, or human units (`1.5 MiB`) with `human`.
pub fn size(n: u64, human: bool) -> String {
    if human {
        human_bytes(n)
    } else {
        n.to_string()
    }
}

/// One `ls` line, like `hdfs dfs -ls`: type and permissions, replication (`-` for a
/// directory), size, modification time (UTC), path.
pub fn ls_line(s: &FileStatus, human: bool) -> String {
    let (perm, repl) = match s.kind {
        FileKind::Directory => ("drwxr-xr-x", "-".to_string()),
        FileKind::File => ("-rw-r--r--", s.replication.to_string()),
    };
    format!(
        "{perm} {repl:>3} {:>10} {} {}",
        size(s.length, human),
        date_time(s.modification_time_ms),
        s.path
    )
}

/// `YYYY-MM-DD HH:MM` in UTC for milliseconds since the Unix epoch.
pub fn date_time(ms: u64) -> String {
    let secs = ms / 1000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60
    )
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (H. Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// The verdict as `hdfs fsck` prints it.
pub fn health(h: Health) -> &'static str {
    match h {
        Health::Healthy => "HEALTHY",
        Health::UnderReplicated => "UNDER_REPLICATED",
        Health::Corrupt => "CORRUPT",
        Health::Missing => "MISSING",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_utc_calendar_dates() {
        assert_eq!(date_time(0), "1970-01-01 00:00");
        // 2026-12-02 17:35:00 UTC
        assert_eq!(date_time(1_796_232_900_000), "2026-12-02 17:35");
        // 2024-02-29 (leap day) 12:00 UTC
        assert_eq!(date_time(1_709_208_000_000), "2024-02-29 12:00");
    }

    #[test]
    fn ls_lines_look_like_hdfs() {
        let f = FileStatus {
            path: "/a/b".into(),
            kind: FileKind::File,
            length: 1536,
            replication: 3,
            block_size: 1 << 20,
            modification_time_ms: 0,
            under_construction: false,
            block_count: 1,
        };
        assert_eq!(
            ls_line(&f, false),
            "-rw-r--r--   3       1536 1970-01-01 00:00 /a/b"
        );
        assert!(ls_line(&f, true).contains("1.5 KiB"));
    }
}
