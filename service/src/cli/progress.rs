//! Embedding progress on stderr (issue 42: a cold `scd compress` of 19.9k
//! tokens ran 57 s in silence, and `embed-batch` sat at "0/2000" until its
//! one block was done). The engine tells an [`EncodeProgress`] of each call
//! and of each model batch as it is embedded, so the bars here advance with
//! the work and their rate and ETA are true:
//!
//! - [`TokenProgress`]: the tokens a command embeds through the engine
//!   (`scd compress`), all calls together;
//! - [`TextProgress`]: one encoder's calls as texts, on `scd embed-batch`'s
//!   bar of records.
//!
//! A bar ([`Delayed`]) appears once the run has embedded for a second
//! ([`REVEAL_AFTER`]), on a terminal only, and never with `--quiet`
//! ([`stderr_target`]); a run the embedding cache answers whole embeds
//! nothing and shows none.

use std::io::IsTerminal as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use scd_engine::encoder::EncodeProgress;

/// How long a run embeds before its bar appears.
pub const REVEAL_AFTER: Duration = Duration::from_secs(1);

/// Where a bar draws once revealed: stderr when it is a terminal, unless
/// `quiet` (none: never drawn).
pub fn stderr_target(quiet: bool) -> Option<ProgressDrawTarget> {
    (!quiet && std::io::stderr().is_terminal()).then(ProgressDrawTarget::stderr)
}

/// A bar that draws nothing until `delay` after its first
/// [`poke`](Delayed::poke), then draws to its target (if it has one) and
/// ticks on its own, so elapsed time and ETA stay live between batches.
#[derive(Debug)]
pub struct Delayed {
    bar: ProgressBar,
    target: Mutex<Option<ProgressDrawTarget>>,
    delay: Duration,
    first: OnceLock<Instant>,
    /// Units [`advance`](Delayed::advance)d since the first poke.
    advanced: AtomicU64,
}

impl Delayed {
    /// `bar` (made hidden: [`ProgressBar::with_draw_target`] with
    /// [`ProgressDrawTarget::hidden`]) shown on `target` once `delay` has
    /// passed since the first poke.
    pub fn new(bar: ProgressBar, target: Option<ProgressDrawTarget>, delay: Duration) -> Self {
        Self { bar, target: Mutex::new(target), delay, first: OnceLock::new(), advanced: AtomicU64::new(0) }
    }

    /// `n` more `unit`s done: the bar moves, and its prefix becomes the rate
    /// (all units advanced over the time since the first poke) and the
    /// time left at it.
    pub fn advance(&self, n: u64, unit: &str) {
        self.poke();
        self.bar.inc(n);
        let advanced = self.advanced.fetch_add(n, Ordering::Relaxed) + n;
        let since = self.first.get().map_or(0.0, |t| t.elapsed().as_secs_f64());
        let rate = advanced as f64 / since.max(1e-3);
        let left = self.bar.length().unwrap_or(0).saturating_sub(self.bar.position()) as f64 / rate.max(1e-9);
        self.bar.set_prefix(format!("{rate:.1} {unit}/s, {left:.0}s left"));
    }

    /// The bar.
    pub fn bar(&self) -> &ProgressBar {
        &self.bar
    }

    /// Work happened: the first poke starts the clock; one past the delay
    /// shows the bar.
    pub fn poke(&self) {
        let first = *self.first.get_or_init(Instant::now);
        if first.elapsed() < self.delay {
            return;
        }
        if let Some(target) = self.target.lock().unwrap_or_else(|e| e.into_inner()).take() {
            self.bar.set_draw_target(target);
            self.bar.enable_steady_tick(Duration::from_millis(200));
        }
    }
}

/// The tokens a command embeds through the engine, all calls together: the
/// bar's length grows by each call's tokens and it advances by each batch's;
/// once all known work is done it clears (the command prints its result),
/// and the next call starts it again. Its rate is the tokens embedded over
/// the time since the first call began (model batches only: loading,
/// chunking and the cache are not in it; [`Delayed::advance`]).
#[derive(Debug)]
pub struct TokenProgress {
    shown: Delayed,
    /// Whether a call began; also serializes begin and advance (finish and
    /// restart).
    started: Mutex<bool>,
}

impl TokenProgress {
    /// A bar for `target` ([`stderr_target`]) after `delay` ([`REVEAL_AFTER`]).
    pub fn new(target: Option<ProgressDrawTarget>, delay: Duration) -> Arc<Self> {
        let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::hidden());
        bar.set_style(
            ProgressStyle::with_template("embedding {bar:30} {human_pos}/{human_len} tokens, {prefix}")
                .expect("a valid template"),
        );
        Arc::new(Self { shown: Delayed::new(bar, target, delay), started: Mutex::new(false) })
    }

    /// The bar (its position and length are tokens).
    pub fn bar(&self) -> &ProgressBar {
        self.shown.bar()
    }
}

impl EncodeProgress for TokenProgress {
    fn begin(&self, _texts: usize, tokens: usize) {
        let mut started = self.started.lock().unwrap_or_else(|e| e.into_inner());
        let bar = self.shown.bar();
        if !*started || bar.is_finished() {
            *started = true;
            bar.set_length(tokens as u64);
            bar.reset();
        } else {
            bar.inc_length(tokens as u64);
        }
        self.shown.poke();
    }

    fn advance(&self, tokens: usize) {
        let _order = self.started.lock().unwrap_or_else(|e| e.into_inner());
        self.shown.advance(tokens as u64, "tokens");
        let bar = self.shown.bar();
        if Some(bar.position()) >= bar.length() {
            bar.finish_and_clear();
        }
    }
}

/// One encoder's calls, each a block of texts, advancing a shared bar of
/// texts as its batches are embedded: a call of `n` texts moves it by `n`
/// in all, in proportion to the tokens done ([`Delayed::advance`]: with
/// the rate of every encoder together).
#[derive(Debug)]
pub struct TextProgress {
    shown: Arc<Delayed>,
    /// The current call: (texts, tokens, tokens done, texts shown).
    call: Mutex<(usize, usize, usize, usize)>,
}

impl TextProgress {
    /// An encoder's reporter onto `shown` (one per encoder: an encoder's
    /// calls follow each other).
    pub fn new(shown: Arc<Delayed>) -> Arc<Self> {
        Arc::new(Self { shown, call: Mutex::new((0, 0, 0, 0)) })
    }
}

impl EncodeProgress for TextProgress {
    fn begin(&self, texts: usize, tokens: usize) {
        *self.call.lock().unwrap_or_else(|e| e.into_inner()) = (texts, tokens, 0, 0);
        self.shown.poke();
    }

    fn advance(&self, tokens: usize) {
        let mut call = self.call.lock().unwrap_or_else(|e| e.into_inner());
        let (texts, total, done, shown) = &mut *call;
        *done += tokens;
        let now = if *done >= *total { *texts } else { *texts * *done / *total };
        self.shown.advance(now.saturating_sub(*shown) as u64, "texts");
        *shown = now.max(*shown);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A terminal that keeps what is written to it.
    #[derive(Debug, Clone, Default)]
    struct Screen(Arc<Mutex<String>>);

    impl indicatif::TermLike for Screen {
        fn width(&self) -> u16 {
            120
        }
        fn move_cursor_up(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_down(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_right(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_left(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn write_line(&self, s: &str) -> std::io::Result<()> {
            self.write_str(&format!("{s}\n"))
        }
        fn write_str(&self, s: &str) -> std::io::Result<()> {
            self.0.lock().unwrap().push_str(s);
            Ok(())
        }
        fn clear_line(&self) -> std::io::Result<()> {
            Ok(())
        }
        fn flush(&self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Screen {
        fn target(&self) -> Option<ProgressDrawTarget> {
            Some(ProgressDrawTarget::term_like(Box::new(self.clone())))
        }
        fn text(&self) -> String {
            self.0.lock().unwrap().clone()
        }
    }

    /// Two calls of three batches each, as the engine reports them.
    fn embed_twice(p: &dyn EncodeProgress) {
        for tokens in [[100, 100, 50], [10, 20, 30]] {
            p.begin(7, tokens.iter().sum());
            for t in tokens {
                p.advance(t);
            }
        }
    }

    #[test]
    fn tokens_advance_per_batch_and_the_bar_clears_when_the_known_work_is_done() {
        let p = TokenProgress::new(None, Duration::ZERO);
        p.begin(3, 250);
        p.advance(100);
        assert_eq!((p.bar().position(), p.bar().length()), (100, Some(250)));
        p.advance(150);
        assert!(p.bar().is_finished());
        p.begin(1, 60);
        assert!(!p.bar().is_finished());
        p.advance(60);
        assert_eq!((p.bar().position(), p.bar().length()), (60, Some(60)));
    }

    #[test]
    fn the_bar_shows_only_after_the_delay_and_never_without_a_terminal() {
        // before the delay: nothing drawn
        let screen = Screen::default();
        let p = TokenProgress::new(screen.target(), Duration::from_secs(3600));
        embed_twice(p.as_ref());
        assert_eq!(screen.text(), "");
        // past it: the bar, in tokens with a rate
        let screen = Screen::default();
        let p = TokenProgress::new(screen.target(), Duration::ZERO);
        p.begin(7, 250);
        p.advance(100);
        p.bar().tick();
        let drawn = screen.text();
        assert!(drawn.contains("embedding") && drawn.contains("100/250 tokens, "), "{drawn:?}");
        assert!(drawn.contains(" tokens/s, ") && drawn.contains("s left"), "{drawn:?}");
        // quiet, or stderr not a terminal: no target, nothing ever drawn
        let p = TokenProgress::new(None, Duration::ZERO);
        embed_twice(p.as_ref());
        assert!(p.bar().is_hidden());
        assert!(stderr_target(true).is_none());
    }

    #[test]
    fn texts_advance_in_proportion_to_the_tokens_done_and_add_up_to_each_call() {
        let bar = ProgressBar::with_draw_target(Some(20), ProgressDrawTarget::hidden());
        let shown = Arc::new(Delayed::new(bar, None, Duration::ZERO));
        let (p, other) = (TextProgress::new(shown.clone()), TextProgress::new(shown.clone()));
        p.begin(7, 250);
        let mut seen = Vec::new();
        for t in [100, 100, 50] {
            p.advance(t);
            seen.push(shown.bar().position());
        }
        assert_eq!(seen, [2, 5, 7]);
        other.begin(7, 60);
        other.advance(60);
        assert_eq!(shown.bar().position(), 14);
        assert!(shown.bar().prefix().ends_with("texts/s, 0s left"), "{}", shown.bar().prefix());
    }
}
