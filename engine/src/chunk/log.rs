//! Logs: each entry is a line with its continuation frames (an indented
//! line, `at …`, `File "…"`, a numbered frame with its address); an error
//! entry is a group of its own, its line the lead and its frames a second
//! chunk; runs of ordinary entries are grouped up to `run_lines` lines.
//! And how bad a line is ([`severity`]): a raised exception's line, another
//! error (by its words or its syslog level), a warning.

use super::{lines, RawChunk};

/// How bad the worst line of a log text is: 3 a raised exception's line
/// (`ValueError: bad input`, `java.io.IOException: closed`: the error's
/// name and message, which a traceback ends with), 2 another error, 1 a
/// warning, 0 neither.
pub fn severity(text: &str) -> u8 {
    text.lines().map(line_severity).max().unwrap_or(0)
}

/// How bad one log line is (as [`severity`]), its syslog level read once.
fn line_severity(line: &str) -> u8 {
    let level = syslog_level(line);
    if is_exception_line(line) || trace_body(line).is_some_and(ends_traceback) {
        3
    } else if is_error(line, level) {
        2
    } else if has_word(line, "WARN") || level == 1 {
        1
    } else {
        0
    }
}

/// Words of an error line, upper-cased: log levels, a raised exception, and
/// a crash (a crash report's `Crashed Thread:`, `Thread 5 Crashed:`; a fatal
/// signal; a segmentation fault).
const ERROR_WORDS: [&str; 15] = [
    "ERROR",
    "FATAL",
    "PANIC",
    "EXCEPTION",
    "TRACEBACK",
    "CRITICAL",
    "FAILED",
    "CRASHED",
    "SIGSEGV",
    "SIGABRT",
    "SIGBUS",
    "SIGILL",
    "SIGFPE",
    "SEGFAULT",
    "SEGMENTATION FAULT",
];

/// Whether a line names a raised exception: a word that is a class name
/// ending in `Error` or `Exception` after at least one more letter (with an
/// optional package path: `AssertionError`, `java.io.IOException`, not
/// `SQLITE_ERROR` or a bare `Error`), followed by a colon or ending the
/// line.
fn is_exception_line(line: &str) -> bool {
    let mut words = line.split_whitespace().peekable();
    while let Some(w) = words.next() {
        let name = match w.strip_suffix(':') {
            Some(n) => n,
            None if words.peek().is_none() => w,
            None => continue,
        };
        let class = name.rsplit('.').next().unwrap_or(name);
        let path_ok = name
            .split('.')
            .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$'));
        let stem = class.strip_suffix("Error").or_else(|| class.strip_suffix("Exception"));
        if path_ok && class.starts_with(|c: char| c.is_ascii_uppercase()) && stem.is_some_and(|s| !s.is_empty()) {
            return true;
        }
    }
    false
}

/// The text of an OpenStack (oslo.log) `TRACE` line after its prefix:
/// `2015-10-20 09:10:57.153 28139 TRACE nova.api   File "…", line 9` holds
/// `  File "…", line 9`. Such lines carry a traceback logged with the
/// entry before them, one line of it each.
fn trace_body(line: &str) -> Option<&str> {
    let mut rest = line;
    let mut words = [""; 5];
    for w in &mut words {
        let t = rest.trim_start_matches(' ');
        let end = t.find(' ').unwrap_or(t.len());
        (*w, rest) = t.split_at(end);
        if w.is_empty() {
            return None;
        }
    }
    let [date, time, pid, level, _logger] = words;
    let digits = |s: &str, extra: &[char]| s.chars().all(|c| c.is_ascii_digit() || extra.contains(&c));
    let prefix = level == "TRACE" && digits(date, &['-']) && digits(time, &[':', '.']) && digits(pid, &[]);
    let body = rest.strip_prefix(' ').unwrap_or(rest);
    // nova's `[instance: <uuid>] ` tag before each line of a traceback
    let body = match body.strip_prefix("[instance: ").and_then(|b| b.split_once("] ")) {
        Some((_, after)) => after,
        None => body,
    };
    prefix.then_some(body)
}

/// Whether a `TRACE` line's text ends its traceback: Python prints the
/// exception unindented after the frames, whatever its class is called, as
/// its name (a dotted identifier) then a colon or nothing
/// (`ConnectionForced: (320) …`, `error: [Errno 32] Broken pipe`); not a
/// sentence such as `During handling of the above exception, …`.
fn ends_traceback(body: &str) -> bool {
    if body.starts_with(char::is_whitespace) {
        return false;
    }
    let name = body.split_once(':').map_or(body.trim_end(), |(n, _)| n);
    let ident = |p: &str| {
        p.starts_with(|c: char| c.is_ascii_alphabetic()) && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    !name.is_empty() && name != "Traceback" && name.split('.').all(ident)
}

/// Whether `line`, whose [`syslog_level`] is `level`, is an error line.
fn is_error(line: &str, level: u8) -> bool {
    ERROR_WORDS.iter().any(|k| has_word(line, k)) || level == 2
}

/// Syslog facilities, as `dmesg -x` and syslog files name them.
const FACILITIES: [&str; 20] = [
    "kern", "user", "mail", "daemon", "auth", "syslog", "lpr", "news", "uucp", "cron", "authpriv", "ftp", "local0",
    "local1", "local2", "local3", "local4", "local5", "local6", "local7",
];

/// A line's syslog level where the line states one in a standard form: the
/// `facility:level :` prefix of `dmesg -x` (`kern  :crit  : [18706.13] mce:
/// …`) or a `<N>` priority at its start (RFC 5424, `dmesg -r`): 2 for
/// emerg, alert, crit and err (levels 0–3), 1 for warning (4), else 0.
fn syslog_level(line: &str) -> u8 {
    let t = line.trim_start();
    if let Some((n, _)) = t.strip_prefix('<').and_then(|r| r.split_once('>')) {
        return match n.parse::<u32>() {
            Ok(p) if n.len() <= 3 => match p % 8 {
                0..=3 => 2,
                4 => 1,
                _ => 0,
            },
            _ => 0,
        };
    }
    let mut parts = t.splitn(3, ':');
    match (parts.next(), parts.next(), parts.next()) {
        (Some(facility), Some(level), Some(_)) if FACILITIES.contains(&facility.trim()) => match level.trim() {
            "emerg" | "alert" | "crit" | "err" => 2,
            "warn" | "warning" => 1,
            _ => 0,
        },
        _ => 0,
    }
}

/// Whether `line` holds `word` (upper case) case-insensitively where a word
/// starts: after a byte that is not a letter or digit, or at a camel-case
/// step (`ValueError`, `IOException`). So `NOERROR` (a DNS
/// answer's "no error") is not `ERROR`.
fn has_word(line: &str, word: &str) -> bool {
    let (b, w) = (line.as_bytes(), word.as_bytes());
    let starts_word = |p: usize| {
        let (prev, next) = (b[p - 1], b.get(p + 1).copied().unwrap_or(b' '));
        !prev.is_ascii_alphanumeric()
            || (b[p].is_ascii_uppercase() && (prev.is_ascii_lowercase() || next.is_ascii_lowercase()))
    };
    b.len() >= w.len()
        && (0..=b.len() - w.len()).any(|p| b[p..p + w.len()].eq_ignore_ascii_case(w) && (p == 0 || starts_word(p)))
}

fn is_frame(line: &str) -> bool {
    let t = line.trim_start();
    if let Some(body) = trace_body(line) {
        return body.starts_with(char::is_whitespace) || body.trim().is_empty();
    }
    line.starts_with(char::is_whitespace)
        || t.starts_with("at ")
        || t.starts_with("File \"")
        || t.starts_with("Caused by")
        || t.starts_with("...")
        || numbered_frame(t)
}

/// A numbered stack frame with its address: an Apple crash report's
/// `4   kaki   0x0000000100081a1c main + 108` (number, image, address) or
/// gdb's `#0  0x00007f3a… in f ()`, so a thread's stack stays with the
/// line that names the thread.
fn numbered_frame(t: &str) -> bool {
    let mut w = t.split_whitespace();
    let (Some(n), Some(a), Some(b)) = (w.next(), w.next(), w.next()) else { return false };
    let hex = |x: &str| x.strip_prefix("0x").is_some_and(|h| h.len() >= 6 && h.bytes().all(|c| c.is_ascii_hexdigit()));
    match n.strip_prefix('#') {
        Some(k) => !k.is_empty() && k.bytes().all(|c| c.is_ascii_digit()) && hex(a),
        None => n.bytes().all(|c| c.is_ascii_digit()) && hex(b),
    }
}

pub(super) fn chunk(text: &str, run_lines: usize) -> Vec<RawChunk> {
    // each entry is a line plus its continuation frames; an error entry is
    // its own group, its line the lead and its frames a second chunk (so
    // the line can go without them); runs of ordinary entries are grouped
    // (up to `run_lines` lines)
    let mut out: Vec<RawChunk> = Vec::new();
    let mut group = 0;
    let mut ordinary = 0;
    let entry = |s: usize, e: usize, group: usize, lead: bool| RawChunk {
        start: s,
        end: e,
        heading: None,
        group,
        lead,
        defines: vec![],
        chunker: "log",
        rides: false,
    };
    for (s, e) in lines(text) {
        let line = &text[s..e];
        if line.trim().is_empty() {
            continue;
        }
        if is_frame(line) {
            // an empty TRACE line (a traceback's last) ends what it follows
            let empty = trace_body(line).is_some_and(|b| b.trim().is_empty());
            match out.last_mut() {
                Some(last) if empty => last.end = e,
                // an error line's first frame opens its frames' chunk
                Some(last) if last.lead && ordinary == 0 => {
                    let g = last.group;
                    out.push(entry(s, e, g, false));
                }
                Some(last) => last.end = e,
                None => {}
            }
            if !out.is_empty() {
                continue;
            }
        }
        let error = line_severity(line) >= 2;
        match out.last_mut() {
            Some(last) if !error && ordinary > 0 && ordinary < run_lines => {
                last.end = e;
                ordinary += 1;
            }
            _ => {
                group += 1;
                out.push(entry(s, e, group, true));
                ordinary = usize::from(!error);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::severity;
    use crate::chunk::tests::{field, texts};
    use crate::chunk::{chunk_field, ChunkConfig};
    use crate::context::FieldKind;

    fn all_at(level: u8, lines: &[&str]) {
        for line in lines {
            assert_eq!(severity(line), level, "{line}");
        }
    }

    #[test]
    fn severity_reads_words_not_substrings() {
        let errors = [
            "2024-01-01 ERROR db down",
            "error: could not compile",
            "Crashed Thread:  5",
            "Thread 5 Crashed:",
            "Exception Type:  EXC_CRASH (SIGABRT)",
            "Fatal signal 11 (SIGSEGV), code 1",
            "Segmentation fault (core dumped)",
            // a name mentioned, a bare `Error:`, an upper-case constant: no exception line
            "INFO handled NotFoundException for /x",
            "Error: Cannot find module 'x'",
            "SQLITE_ERROR: database is locked",
            "ERROR neutron.service [-] Unrecoverable error: please check log for details.",
        ];
        all_at(2, &errors);
        // a raised exception's line (the end of a traceback) ranks above
        let raised = [
            "ValueError: bad input",
            "java.io.IOException: closed",
            "java.lang.NullPointerException",
            "2015-10-29 10:51:12.480 3405 TRACE neutron.service AssertionError: Calling waitall() from within",
            "Caused by: org.postgresql.util.PSQLException: FATAL: the database system is in recovery mode",
        ];
        all_at(3, &raised);
        // a DNS answer's rcode `NOERROR` is no error; `FORWARNED` no warning
        let dns = "1379288690.38\tCYZ\t192.168.33.10\t53\tudp\tj.maxmind.com\t1\tA\t0\tNOERROR\tF";
        assert_eq!(severity(dns), 0);
        assert_eq!(severity("WARNING: disk 91% full"), 1);
        assert_eq!(severity("FORWARNED is forearmed"), 0);
    }

    #[test]
    fn severity_reads_syslog_levels_in_their_standard_forms() {
        let crit = "kern  :crit  : [18706.135478] mce: CPU6: Package temperature above threshold, cpu clock throttled";
        assert_eq!(severity(crit), 2);
        assert_eq!(severity("daemon:err   : [  12.5] foo.service: start request repeated too quickly"), 2);
        assert_eq!(severity("kern  :warn  : [    0.1] ACPI: _OSC evaluation failed"), 2, "a word still counts");
        assert_eq!(severity("kern  :warn  : [    0.1] x86/cpu: SGX disabled by BIOS."), 1);
        assert_eq!(severity("<3>[ 5.1] usb 1-1: device descriptor read/64, error -71"), 2);
        assert_eq!(severity("<11>kernel: disk gone"), 2, "facility 1, level 3");
        assert_eq!(severity("<4>[ 0.2] clocksource: unstable"), 1);
        assert_eq!(severity("<6>[ 0.3] usb 1-1: new device"), 0);
        // not a facility, or not a level: an ordinary line
        assert_eq!(severity("kern  :info  : [    0.0] Linux version 5.0.9"), 0);
        assert_eq!(severity("note: crit: the critics liked it"), 0);
        assert_eq!(severity("<html>crit</html>"), 0);
    }

    #[test]
    fn log_keeps_stack_frames_in_their_error_group() {
        let f = field(
            FieldKind::Log,
            "INFO start\nINFO ready\nERROR boom in charge\n    at payments::charge (src/pay.rs:10)\n    at main\nINFO retry",
        );
        let t = texts(&f);
        assert_eq!(
            t,
            [
                "INFO start\nINFO ready",
                "ERROR boom in charge",
                "at payments::charge (src/pay.rs:10)\n    at main",
                "INFO retry"
            ]
        );
        let c = chunk_field(&f, ChunkConfig::default());
        // the error line leads its group, so its frames bring it along
        assert!(c[1].lead && !c[2].lead);
        assert_eq!(c[1].group, c[2].group);
        assert_ne!(c[0].group, c[1].group);
        assert_ne!(c[3].group, c[1].group);
    }

    #[test]
    fn numbered_frames_of_a_crash_report_stay_with_their_thread() {
        let report = "Exception Type:  SIGSEGV\nCrashed Thread:  5\n\nThread 4:\n\
                      0   libsystem_kernel.dylib        0x00007fff61bca1b2 0x7fff61bc6000 + 16818\n\
                      1   YetAnotherMac                 0x0000000109482f6f 0x10864e000 + 14897007\n\n\
                      Thread 5 Crashed:\n\
                      0   YetAnotherMac                 0x00000001090a0132 0x10864e000 + 10821938\n\
                      #1  0x00007f3a2b in handler () at src/h.c:12\n\
                      2 apples 0x12 is no frame";
        let f = field(FieldKind::Log, report);
        let c = chunk_field(&f, ChunkConfig::default());
        let t: Vec<&str> = c.iter().map(|c| &report[c.start..c.end]).collect();
        let thread4 = t.iter().position(|x| x.starts_with("Thread 4:")).unwrap();
        assert!(t[thread4].ends_with("+ 14897007"), "{t:?}");
        let crashed = t.iter().position(|x| *x == "Thread 5 Crashed:").unwrap();
        // the crashed thread's frames: its error line's second chunk, in its group
        assert!(t[crashed + 1].starts_with("0   YetAnotherMac") && t[crashed + 1].ends_with("src/h.c:12"), "{t:?}");
        assert_eq!(c[crashed].group, c[crashed + 1].group);
        assert_eq!(t[crashed + 2], "2 apples 0x12 is no frame");
    }

    #[test]
    fn an_openstack_trace_is_read_as_a_traceback() {
        let p = "2015-10-20 09:10:57.153 28139";
        let log = format!(
            "{p} ERROR oslo.rabbit [-] Failed to consume message from queue\n\
             {p} TRACE oslo.rabbit Traceback (most recent call last):\n\
             {p} TRACE oslo.rabbit   File \"/usr/lib/impl_rabbit.py\", line 674, in ensure\n\
             {p} TRACE oslo.rabbit     return method()\n\
             {p} TRACE oslo.rabbit ConnectionForced: (320) broker forced connection closure\n\
             {p} TRACE oslo.rabbit \n\
             {p} INFO oslo.rabbit [-] Delaying reconnect for 1.0 seconds...\n\
             {p} INFO nova.x [-] ConnectionForced: a name in an ordinary line"
        );
        let f = field(FieldKind::Log, &log);
        let c = chunk_field(&f, ChunkConfig::default());
        let t: Vec<&str> = c.iter().map(|c| &log[c.start..c.end]).collect();
        let tb = t.iter().position(|x| x.ends_with("Traceback (most recent call last):")).unwrap();
        // the frames: the traceback line's second chunk, in its group
        assert!(t[tb + 1].contains("File \"") && t[tb + 1].ends_with("return method()"), "{t:?}");
        assert_eq!((c[tb].group, c[tb].lead, c[tb + 1].lead), (c[tb + 1].group, true, false));
        // the exception the frames end with leads a group of its own and ranks as raised
        assert!(t[tb + 2].contains("broker forced connection closure") && c[tb + 2].lead, "{t:?}");
        assert_eq!(severity(t[tb + 2]), 3);
        assert_eq!(severity(t[tb + 1]), 0, "frames are no error");
        assert!(
            t[tb + 2].ends_with("\n2015-10-20 09:10:57.153 28139 TRACE oslo.rabbit"),
            "the empty TRACE line joins the exception: {t:?}"
        );
        assert!(t[tb + 3].contains("Delaying reconnect"));
        assert_eq!(severity(t.last().unwrap()), 0, "only a TRACE line ends a traceback");
        // nova's instance tag; a sentence or a TRACE frame is no exception
        let tagged = format!("{p} TRACE nova.compute.manager [instance: 9f1c] ");
        assert_eq!(severity(&format!("{tagged}  File \"/usr/lib/x.py\", line 3, in f")), 0);
        assert_eq!(severity(&format!("{tagged}InstanceNotFound: Instance 9f1c could not be found.")), 3);
        // (an error by its word `exception`, not a raised one)
        assert_eq!(severity(&format!("{p} TRACE nova.x During handling of the above exception, another occurred:")), 2);
        assert_eq!(severity(&format!("{p} TRACE nova.x error: [Errno 32] Broken pipe")), 3);
    }

    #[test]
    fn log_runs_of_ordinary_entries_are_bounded_by_log_run_lines() {
        let log = "INFO a\nINFO b\nINFO c\nINFO d\nINFO e\nERROR f failed\n    at g\nINFO h\nINFO i";
        let f = field(FieldKind::Log, log);
        let texts_at = |run: usize| -> Vec<String> {
            let cfg = ChunkConfig { log_run_lines: run, ..ChunkConfig::default() };
            chunk_field(&f, cfg).iter().map(|c| log[c.start..c.end].to_string()).collect()
        };
        assert_eq!(
            texts_at(4),
            ["INFO a\nINFO b\nINFO c\nINFO d", "INFO e", "ERROR f failed", "at g", "INFO h\nINFO i"]
        );
        assert_eq!(
            texts_at(2),
            ["INFO a\nINFO b", "INFO c\nINFO d", "INFO e", "ERROR f failed", "at g", "INFO h\nINFO i"]
        );
        // one entry per chunk, each its own group; an error keeps its frames apart
        let one = chunk_field(&f, ChunkConfig { log_run_lines: 1, ..ChunkConfig::default() });
        let t: Vec<&str> = one.iter().map(|c| &log[c.start..c.end]).collect();
        assert_eq!(t, ["INFO a", "INFO b", "INFO c", "INFO d", "INFO e", "ERROR f failed", "at g", "INFO h", "INFO i"]);
        assert!(one.iter().filter(|c| c.start != log.find("at g").unwrap()).all(|c| c.lead));
        assert_eq!(one[5].group, one[6].group);
        assert_eq!(ChunkConfig::default().log_run_lines, 4);
    }
}
