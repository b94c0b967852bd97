//! The page at `/ui` on `scd serve --http-addr`, in a real headless
//! Chromium (Debian's `chromium` and `chromium-driver`, which
//! `service/tests/setup.sh` installs) driven over the WebDriver protocol
//! (plain JSON over HTTP to `chromedriver`): a task and the fixture context
//! pasted, a file picked, Compress; the chunk of the failing log line is
//! highlighted in place with its score and why, what was held back is
//! listed, the confidential field's secret appears nowhere, a follow-up
//! adds new chunks; a screenshot is a real PNG (`SCD_UPDATE_SCREENSHOT=1`
//! writes it to `docs/ui.png`). The page is served with a strict
//! Content-Security-Policy, and `--no-ui` takes it away.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{json, Value};

use super::a2a::{parse_response, start};
use super::replicas::have;
use crate::{ready, root, scratch};

/// The key of a WebDriver element reference.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// The secret in the fixture's confidential field.
const SECRET: &str = "sk_live_SECRET_4242";

/// One HTTP/1.1 exchange with a read timeout: status, head (lower-cased) and body.
fn exchange(addr: &str, method: &str, path: &str, body: &str) -> (u16, String, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).unwrap();
    let raw = read_response(&mut s);
    let head = String::from_utf8_lossy(&raw).split("\r\n\r\n").next().unwrap_or_default().to_ascii_lowercase();
    let (status, body) = parse_response(&raw);
    (status, head, body)
}

/// A response's bytes: to the end of its `Content-Length` (chromedriver
/// says `Connection: close` and keeps the connection open), else to EOF.
fn read_response(s: &mut TcpStream) -> Vec<u8> {
    let mut raw = Vec::new();
    let mut buf = [0u8; 64 * 1024];
    loop {
        if let Some(at) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&raw[..at]).to_ascii_lowercase();
            let length =
                head.lines().find_map(|l| l.strip_prefix("content-length:")).map(|v| v.trim().parse::<usize>());
            if let Some(Ok(n)) = length {
                if raw.len() >= at + 4 + n {
                    return raw;
                }
            }
        }
        let n = s.read(&mut buf).unwrap();
        if n == 0 {
            return raw;
        }
        raw.extend_from_slice(&buf[..n]);
    }
}

/// A chromedriver on a free loopback port with one headless Chromium
/// session; dropping it ends the session (Chromium exits), stops the
/// driver and removes its folder.
struct Browser {
    driver: Child,
    addr: String,
    session: String,
    dir: PathBuf,
}

impl Browser {
    fn start(dir: PathBuf) -> Browser {
        std::fs::create_dir_all(&dir).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .arg(format!("--log-path={}", dir.join("chromedriver.log").display()))
            .current_dir(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts");
        let mut b = Browser { driver, addr: format!("127.0.0.1:{port}"), session: String::new(), dir };
        let up = Instant::now();
        while !b.driver_ready() {
            assert!(up.elapsed() < Duration::from_secs(30), "chromedriver did not answer on {}", b.addr);
            std::thread::sleep(Duration::from_millis(100));
        }
        let profile = b.dir.join("profile");
        let caps = json!({"capabilities": {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": {
            "binary": on_path("chromium"),
            "args": ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                     "--window-size=1280,2400", "--hide-scrollbars", format!("--user-data-dir={}", profile.display())],
        }}}});
        let v = b.call("POST", "/session", &caps);
        b.session = v["sessionId"].as_str().expect("a WebDriver session").to_string();
        b
    }

    fn driver_ready(&self) -> bool {
        TcpStream::connect(&self.addr).is_ok() && {
            let (status, _, body) = exchange(&self.addr, "GET", "/status", "");
            status == 200 && serde_json::from_str::<Value>(&body).is_ok_and(|v| v["value"]["ready"] == true)
        }
    }

    /// A WebDriver command: its `value`.
    fn call(&self, method: &str, path: &str, body: &Value) -> Value {
        let body = if body.is_null() { String::new() } else { body.to_string() };
        let (status, _, text) = exchange(&self.addr, method, path, &body);
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|_| panic!("{method} {path}: {status} {text}"));
        assert_eq!(status, 200, "{method} {path}: {v}");
        v["value"].clone()
    }

    fn session_call(&self, method: &str, path: &str, body: &Value) -> Value {
        self.call(method, &format!("/session/{}{path}", self.session), body)
    }

    fn goto(&self, url: &str) {
        self.session_call("POST", "/url", &json!({"url": url}));
    }

    /// The ids of the elements `css` selects.
    fn all(&self, css: &str) -> Vec<String> {
        let v = self.session_call("POST", "/elements", &json!({"using": "css selector", "value": css}));
        let ids = v.as_array().unwrap().iter().map(|e| e[ELEMENT].as_str().map(String::from));
        ids.collect::<Option<_>>().unwrap_or_else(|| panic!("{css}: {v}"))
    }

    /// The one element `css` selects.
    fn one(&self, css: &str) -> String {
        let mut found = self.all(css);
        assert_eq!(found.len(), 1, "{css}");
        found.remove(0)
    }

    fn text(&self, element: &str) -> String {
        self.session_call("GET", &format!("/element/{element}/text"), &Value::Null).as_str().unwrap().to_string()
    }

    /// The texts of the elements `css` selects.
    fn texts(&self, css: &str) -> Vec<String> {
        self.all(css).iter().map(|e| self.text(e)).collect()
    }

    fn type_into(&self, css: &str, text: &str) {
        let e = self.one(css);
        self.session_call("POST", &format!("/element/{e}/clear"), &json!({}));
        self.session_call("POST", &format!("/element/{e}/value"), &json!({"text": text}));
    }

    fn click(&self, css: &str) {
        let e = self.one(css);
        self.session_call("POST", &format!("/element/{e}/click"), &json!({}));
    }

    /// The text of `css` once `done` holds for it (within a minute).
    fn wait_text(&self, css: &str, done: impl Fn(&str) -> bool) -> String {
        let since = Instant::now();
        loop {
            let t = self.text(&self.one(css));
            if done(&t) {
                return t;
            }
            assert!(since.elapsed() < Duration::from_secs(60), "{css} still says {t:?}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn screenshot(&self) -> Vec<u8> {
        let b64 = self.session_call("GET", "/screenshot", &Value::Null);
        base64::engine::general_purpose::STANDARD.decode(b64.as_str().unwrap()).unwrap()
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                exchange(&self.addr, "DELETE", &format!("/session/{}", self.session), "")
            }));
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `program`'s path, found on `PATH`.
fn on_path(program: &str) -> String {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = std::env::split_paths(&path).map(|d| d.join(program)).find(|p| p.is_file());
    found.unwrap_or_else(|| panic!("{program} is not on PATH")).display().to_string()
}

/// Width and height of a PNG (its signature and IHDR checked).
fn png_size(png: &[u8]) -> (u32, u32) {
    assert!(png.len() > 12 + 8 + 13 && png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
    assert_eq!(&png[12..16], b"IHDR", "a PNG starts with its header chunk");
    let be = |at: usize| u32::from_be_bytes(png[at..at + 4].try_into().unwrap());
    (be(16), be(20))
}

fn fixture() -> String {
    std::fs::read_to_string(root().join("fixtures/agent_context.json")).unwrap()
}

/// Pastes the fixture, picks a file, compresses: the page shows the
/// selection in place with why, what was held back, never the secret;
/// a follow-up adds new chunks; the screenshot is a PNG.
#[test]
fn the_page_shows_what_was_kept_and_why_in_a_real_browser() {
    if !ready() || !have("chromium") || !have("chromedriver") {
        return;
    }
    let s = start(&[]);
    let dir = scratch("ui");
    let runbook = dir.join("runbook.md");
    std::fs::write(&runbook, "# Payments runbook\n\nIf charges time out, check the database pool size first.\n")
        .unwrap();
    let b = Browser::start(dir.join("browser"));
    b.goto(&format!("http://{}/ui", s.http));
    let title = b.session_call("GET", "/title", &Value::Null);
    assert_eq!(title, "SCD: what was kept and why", "{}", b.session_call("GET", "/source", &Value::Null));
    b.type_into("#task", "Why are customer charges failing at checkout?");
    b.type_into("#context", &fixture());
    b.type_into("#budget", "150");
    b.click("#tokenizer option[value=cl100k]");
    // the file picker reads the file into a field named by its file name
    let picker = b.one("#files");
    b.session_call("POST", &format!("/element/{picker}/value"), &json!({"text": runbook.display().to_string()}));
    b.wait_text("#file-list", |t| t.contains("runbook.md (markdown"));
    b.click("#compress");
    let status = b.wait_text("#status", |t| t.starts_with("Sent") || t.contains(':'));
    assert!(status.starts_with("Sent") && status.contains("of 150 tokens"), "{status}");

    // the failing log line's chunk is highlighted in place, in its field
    let kept = b.texts("#fields article.field pre mark.kept");
    assert!(kept.iter().any(|t| t.contains("connection pool exhausted")), "{kept:?}");
    let logs = b.texts("#fields article.field");
    assert!(logs.iter().any(|t| t.starts_with("error_logs") && t.contains("service started")), "the whole field");
    assert!(logs.iter().any(|t| t.starts_with("runbook.md")), "the picked file is a field: {logs:?}");
    // each kept chunk's score and why
    let tags = b.texts("#fields pre .tag");
    assert!(!tags.is_empty() && tags.iter().all(|t| t.starts_with('#')), "{tags:?}");
    let reasons = b.texts("#fields ol.why li .reason");
    assert_eq!(reasons.len(), kept.len(), "{reasons:?}");
    assert!(reasons.iter().all(|r| r.contains("dense z") && r.contains("lexical z")), "{reasons:?}");
    let totals = b.text(&b.one("#totals"));
    assert!(totals.contains("of 150 cl100k tokens sent") && totals.contains("api_keys"), "{totals}");
    // what was held back, with why
    let held = b.texts("#held tbody tr");
    assert!(!held.is_empty(), "a held-back list");
    assert!(held.iter().any(|r| r.contains("did not fit the budget") || r.contains("below")), "{held:?}");
    // the confidential field: withheld, its secret nowhere in the page
    let withheld = b.texts("#fields article.withheld");
    assert!(withheld.len() == 1 && withheld[0].starts_with("api_keys") && withheld[0].contains("withheld"));
    let body = b.text(&b.one("body"));
    let source = b.session_call("GET", "/source", &Value::Null);
    assert!(!body.contains(SECRET) && !source.as_str().unwrap().contains(SECRET), "the secret is shown");

    // a follow-up: new chunks, highlighted in place too
    b.type_into("#question", "which table stores charges and their status?");
    b.click("#more");
    let said = b.wait_text("#more-status", |t| t.contains("new chunks") || t.contains(':'));
    assert!(said.contains("new chunks") && !said.starts_with("0 "), "{said}");
    let new = b.texts("#more-chunks li");
    assert!(!new.is_empty() && !b.all("#fields mark.kept.more").is_empty(), "{said}");
    assert!(!b.text(&b.one("body")).contains(SECRET));

    // held back no more
    let held_after = b.texts("#held tbody tr");
    assert!(held_after.len() < held.len(), "{held_after:?}");
    assert!(b.text(&b.one("#held-summary")).contains("sent since by follow-ups"));

    // the results at the top of the window
    b.session_call(
        "POST",
        "/execute/sync",
        &json!({"script": "document.getElementById('results').scrollIntoView()", "args": []}),
    );
    let png = b.screenshot();
    let (w, h) = png_size(&png);
    assert!(w >= 800 && h >= 600 && png.len() > 20_000, "{w}x{h}, {} bytes", png.len());
    std::fs::write(dir.join("ui.png"), &png).unwrap();
    if std::env::var("SCD_UPDATE_SCREENSHOT").is_ok_and(|v| v == "1") {
        std::fs::write(root().join("docs/ui.png"), &png).unwrap();
    }
    drop(b);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The page and its files carry a CSP that allows only this origin;
/// `--no-ui` serves none of them (404), the REST API stays.
#[test]
fn the_page_has_a_strict_csp_and_no_ui_turns_it_off() {
    if !ready() {
        return;
    }
    let s = start(&[]);
    for (path, kind) in [("/ui", "text/html"), ("/ui/app.js", "text/javascript"), ("/ui/app.css", "text/css")] {
        let (status, head, body) = exchange(&s.http, "GET", path, "");
        assert_eq!(status, 200, "{path}");
        assert!(head.contains(&format!("content-type: {kind}")), "{head}");
        assert!(
            head.contains(
                "content-security-policy: default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self';"
            ),
            "{head}"
        );
        assert!(head.contains("x-content-type-options: nosniff"), "{head}");
        assert!(!body.contains("https://") && !body.contains("http://"), "{path} loads nothing from elsewhere");
    }
    let (_, _, page) = exchange(&s.http, "GET", "/ui", "");
    assert!(page.contains("<option value=\"cl100k\" selected>cl100k</option>") && page.contains("value=\"o200k\""));
    drop(s);

    let s = start(&["--no-ui"]);
    for path in ["/ui", "/ui/app.js", "/ui/app.css"] {
        assert_eq!(exchange(&s.http, "GET", path, "").0, 404, "{path}");
    }
    assert_eq!(exchange(&s.http, "GET", "/openapi.json", "").0, 200);
}
