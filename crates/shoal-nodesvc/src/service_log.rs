//! A service's log (`docs/services.md`, "Logs"): its output, line by line
//! with the time and the stream, in `STATE_DIR/services/NAME.log` (0600,
//! in a directory only the daemon's user may enter), rotated to
//! `NAME.log.1` … `NAME.log.KEEP` when it grows past its limit.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Longer lines are cut (and marked so).
pub const MAX_LINE: usize = 64 * 1024;
/// The most a log answer carries.
pub const MAX_ANSWER: usize = 256 * 1024;

/// Makes the logs' directory, private to the daemon's user.
pub fn private_dir(dir: &Path) -> Result<(), String> {
    shoal_rpc::secrets::dir(dir, true)
}

/// One service's log.
pub struct Log {
    path: PathBuf,
    file: Option<File>,
    size: u64,
    max: u64,
    keep: u32,
}

impl Log {
    /// Opens (or creates) `dir/NAME.log`.
    pub fn open(dir: &Path, name: &str, max: u64, keep: u32) -> Result<Log, String> {
        let path = dir.join(format!("{name}.log"));
        let mut log = Log {
            path,
            file: None,
            size: 0,
            max,
            keep,
        };
        log.reopen()?;
        Ok(log)
    }

    fn reopen(&mut self) -> Result<(), String> {
        let file = OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&self.path)
            .map_err(|e| format!("cannot open {}: {e}", self.path.display()))?;
        let meta = file
            .metadata()
            .map_err(|e| format!("{}: {e}", self.path.display()))?;
        if !meta.is_file() {
            return Err(format!("{} is not a regular file", self.path.display()));
        }
        self.size = meta.len();
        self.file = Some(file);
        Ok(())
    }

    pub fn set_limits(&mut self, max: u64, keep: u32) {
        self.max = max;
        self.keep = keep;
    }

    /// Appends one line of stream `tag` (`out`, `err`, or `shoal` for the
    /// daemon's own notes).
    pub fn line(&mut self, tag: &str, text: &[u8]) {
        let cut = text.len() > MAX_LINE;
        let text = String::from_utf8_lossy(&text[..text.len().min(MAX_LINE)]);
        let line = format!(
            "{} {tag} {text}{}\n",
            utc_now(),
            if cut { " [cut]" } else { "" }
        );
        if self.file.is_none() && self.reopen().is_err() {
            return;
        }
        if let Some(file) = &mut self.file
            && file.write_all(line.as_bytes()).is_ok()
        {
            self.size += line.len() as u64;
        }
        if self.size >= self.max {
            self.rotate();
        }
    }

    /// A note of the daemon's about the service (started, ended, …).
    pub fn note(&mut self, text: &str) {
        self.line("shoal", text.as_bytes());
    }

    /// `NAME.log` becomes `NAME.log.1`, each older one moves up one, and
    /// the oldest beyond `keep` goes.
    fn rotate(&mut self) {
        self.file = None;
        let old = |i: u32| PathBuf::from(format!("{}.{i}", self.path.display()));
        let _ = std::fs::remove_file(old(self.keep));
        for i in (1..self.keep).rev() {
            let _ = std::fs::rename(old(i), old(i + 1));
        }
        let _ = std::fs::rename(&self.path, old(1));
        if let Err(e) = self.reopen() {
            tracing::warn!("service log: {e}");
        }
    }

    /// The last `lines` lines (from the current file, and the last rotated
    /// one if it has fewer), and where the log ends now.
    pub fn tail(&self, lines: usize) -> (String, u64) {
        let mut text = read_tail(&self.path, MAX_ANSWER);
        if text.lines().count() < lines {
            let older = read_tail(Path::new(&format!("{}.1", self.path.display())), MAX_ANSWER);
            text = older + &text;
        }
        let all: Vec<&str> = text.lines().collect();
        let from = all.len().saturating_sub(lines);
        let mut out = all[from..].join("\n");
        if !out.is_empty() {
            out.push('\n');
        }
        (out, self.size)
    }

    /// What was written since position `from` (from the start if the log
    /// was rotated since), up to [`MAX_ANSWER`] bytes, and where that ends.
    pub fn since(&self, from: u64) -> (String, u64) {
        let from = if from > self.size { 0 } else { from };
        let Ok(mut file) = File::open(&self.path) else {
            return (String::new(), self.size);
        };
        let want = (self.size - from).min(MAX_ANSWER as u64) as usize;
        let mut buf = vec![0; want];
        let got = file
            .seek(SeekFrom::Start(from))
            .and_then(|_| file.read(&mut buf))
            .unwrap_or(0);
        buf.truncate(got);
        // Whole lines only: the rest comes next time.
        let whole = buf.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        buf.truncate(whole);
        (
            String::from_utf8_lossy(&buf).into_owned(),
            from + whole as u64,
        )
    }
}

/// Up to the last `max` bytes of a file, from a line's start.
fn read_tail(path: &Path, max: usize) -> String {
    let Ok(mut file) = File::open(path) else {
        return String::new();
    };
    let len = file.metadata().map_or(0, |m| m.len());
    let start = len.saturating_sub(max as u64);
    let mut buf = Vec::new();
    if file.seek(SeekFrom::Start(start)).is_err() || file.read_to_end(&mut buf).is_err() {
        return String::new();
    }
    if start > 0
        && let Some(i) = buf.iter().position(|&b| b == b'\n')
    {
        buf.drain(..=i);
    }
    String::from_utf8_lossy(&buf).into_owned()
}

/// Now in UTC, as `2026-11-24T20:30:00.123Z`.
fn utc_now() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    utc(now.as_secs(), now.subsec_millis())
}

fn utc(secs: u64, millis: u32) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_utc_dates() {
        assert_eq!(utc(0, 0), "1970-01-01T00:00:00.000Z");
        assert_eq!(utc(951_782_400, 5), "2000-02-29T00:00:00.005Z");
        assert_eq!(utc(1_795_552_200, 123), "2026-11-24T20:30:00.123Z");
    }

    #[test]
    fn a_log_rotates_keeps_its_limit_and_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = Log::open(dir.path(), "s", 64 << 10, 2).unwrap();
        let line = vec![b'x'; 1000];
        for _ in 0..200 {
            log.line("out", &line);
        }
        log.note("last");
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert!(names.contains(&"s.log.1".to_string()), "{names:?}");
        assert!(names.contains(&"s.log.2".to_string()), "{names:?}");
        assert!(!names.contains(&"s.log.3".to_string()), "{names:?}");
        let (tail, end) = log.tail(2);
        assert_eq!(tail.lines().count(), 2);
        assert!(tail.ends_with("shoal last\n"), "{tail}");
        assert_eq!(
            end,
            std::fs::metadata(dir.path().join("s.log")).unwrap().len()
        );
        let (none, same) = log.since(end);
        assert!(none.is_empty() && same == end);
        log.line("err", b"more");
        let (more, after) = log.since(end);
        assert!(more.ends_with("err more\n") && after > end, "{more}");
        // A line too long is cut and says so.
        log.line("out", &vec![b'y'; MAX_LINE + 10]);
        assert!(log.tail(1).0.trim_end().ends_with("[cut]"));
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join("s.log"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
