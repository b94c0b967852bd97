//! # The page (`GET /ui` on `scd serve --http-addr`, off with `--no-ui`)
//!
//! A small page to look at a selection: paste a task and a context (or pick
//! files), choose a budget and a tokenizer, and see each field with the
//! chunks sent highlighted in place, their scores and why (`explain`), what
//! was held back and why, the totals, and a follow-up box that asks the
//! session for more. It calls the same REST API as every other client
//! (`POST /v1/compress`, `POST /v1/sessions/{id}/more`) from the browser;
//! the server does nothing for it that it does not do for them.
//!
//! Three files, embedded in the binary: the page, its script and its style
//! sheet. No external asset, no inline script or style: every answer
//! carries a Content-Security-Policy that allows only this origin's script,
//! style and `fetch` ([`CSP`]). The script puts every text in the page as
//! text (`textContent`, never markup), and never shows a confidential
//! field's content back, not even the one pasted in.
//!
//! ```no_run
//! # fn run(names: Vec<String>) {
//! // merged into the HTTP listener's router by `server::serve` unless `--no-ui`
//! let page: axum::Router = scd_service::rest::ui::router(&names);
//! # }
//! ```

use axum::http::{header, HeaderName, HeaderValue};
use axum::response::IntoResponse;
use axum::routing::get;

/// The page's Content-Security-Policy: its own script, style and API, and
/// nothing else (no inline code, no other origin, no frames, no forms
/// posted anywhere).
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
                       img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

const PAGE: &str = include_str!("ui/page.html");
const SCRIPT: &str = include_str!("ui/app.js");
const STYLE: &str = include_str!("ui/app.css");

/// Where the page lists the tokenizers (one `<option>` each).
const TOKENIZERS_MARK: &str = "<!--tokenizers-->";

/// `GET /ui` (the page, its tokenizer list naming `tokenizers`: the names the
/// server accepts, the default first), `GET /ui/app.js` and `GET
/// /ui/app.css`.
pub fn router(tokenizers: &[String]) -> axum::Router {
    let page = page(tokenizers);
    axum::Router::new()
        .route("/ui", get(move || async move { answer("text/html; charset=utf-8", page) }))
        .route("/ui/app.js", get(|| async { answer("text/javascript; charset=utf-8", SCRIPT.to_string()) }))
        .route("/ui/app.css", get(|| async { answer("text/css; charset=utf-8", STYLE.to_string()) }))
}

/// The page with one `<option>` per tokenizer (`cl100k` chosen when offered:
/// most receivers count in an OpenAI tokenizer).
fn page(tokenizers: &[String]) -> String {
    let options: String = tokenizers
        .iter()
        .map(|t| {
            let t = escape(t);
            let selected = if t == "cl100k" { " selected" } else { "" };
            format!("<option value=\"{t}\"{selected}>{t}</option>")
        })
        .collect();
    PAGE.replacen(TOKENIZERS_MARK, &options, 1)
}

/// `s` safe in HTML text and in a quoted attribute.
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn answer(content_type: &'static str, body: String) -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
            (header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP)),
            (header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff")),
            (header::REFERRER_POLICY, HeaderValue::from_static("no-referrer")),
            (HeaderName::from_static("cross-origin-opener-policy"), HeaderValue::from_static("same-origin")),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        ],
        body,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_lists_the_tokenizers_escaped_and_loads_nothing_from_elsewhere() {
        let p = page(&["e5".into(), "cl100k".into(), "a\"<b>".into()]);
        assert!(p.contains("<option value=\"e5\">e5</option><option value=\"cl100k\" selected>cl100k</option>"));
        assert!(p.contains("<option value=\"a&quot;&lt;b&gt;\">a&quot;&lt;b&gt;</option>"), "{p}");
        assert!(!p.contains(TOKENIZERS_MARK));
        // no inline script or style (the CSP would block them), no other origin
        for text in [PAGE, SCRIPT, STYLE] {
            assert!(!text.contains("http://") && !text.contains("https://") && !text.contains("//cdn"));
        }
        assert!(!PAGE.contains("<script>") && !PAGE.contains("<style") && !PAGE.contains(" style="));
        assert!(PAGE.contains("<script src=\"/ui/app.js\" defer></script>"));
        // every text goes in as text
        assert!(
            !SCRIPT.contains("innerHTML") && !SCRIPT.contains("outerHTML") && !SCRIPT.contains("insertAdjacentHTML")
        );
    }
}
