//! # scd-dev
//!
//! SCD's developer tools, kept out of the product binary `scd`: the
//! `scd-dev` binary's library. They measure and tune what `scd` ships;
//! users never run them (docs/evaluation.md and docs/testing.md say how
//! to reach them).
//!
//! | module | `scd-dev` command |
//! |---|---|
//! | [`eval`] (with `eval_adaptive`, `eval_agent`) | `eval`: evidence recall vs reduction against baselines |
//! | [`tune`] | `tune`: scoring settings by cross-validation |
//! | [`plot`] | the SVG line plots of `eval --plot` |
//! | [`load`] | `bench-load`: a real `scd serve` under N concurrent clients |
//! | [`conns`] | `bench-conns`: idle sockets against a guarded `scd serve` |
//! | [`bench`] | `bench-encode`: encoder throughput and memory |
//! | [`bench_replicas`] | `bench-replicas`: one replica against two behind HAProxy |
//! | [`atp`] | `atp demo`, `atp flood`, `atp bench`: the ATP stack's live demo, flood and simulator |
//!
//! The tools that start servers run the product binary: `scd` beside
//! `scd-dev` in the same target folder, or `SCD_BIN` ([`scd_exe`]).
//!
//! This crate depends on `scd-service`'s library (model flags, telemetry,
//! the shared CLI pieces such as `scd_service::cli::compress::budget_tokenizer`);
//! `scd-service` never depends on it.
//!
//! ```
//! // the nearest-rank percentile the reports print
//! let mut ms = vec![3.0, 1.0, 2.0, 10.0];
//! assert_eq!(scd_dev::percentile(&mut ms, 0.5), 3.0);
//! ```
#![warn(missing_docs)]

pub mod atp;
pub mod bench;
pub mod bench_replicas;
pub mod conns;
pub mod eval;
mod eval_adaptive;
mod eval_agent;
mod eval_agent_cases;
mod eval_agent_more;
pub mod load;
mod memo;
pub mod plot;
pub mod tune;

use std::path::{Path, PathBuf};

use anyhow::Context as _;

/// The `scd` binary the tools start (`scd serve`, `scd atp agent`):
/// `SCD_BIN` when set, else the `scd` beside this executable (cargo builds
/// both into one target folder: `cargo build --release -p scd-service -p
/// scd-dev`). Missing, it is an error that says how to build it.
pub fn scd_exe() -> anyhow::Result<PathBuf> {
    if let Some(exe) = std::env::var_os("SCD_BIN") {
        return Ok(PathBuf::from(exe));
    }
    let me = std::env::current_exe().context("locating the scd-dev binary")?;
    let exe = me.with_file_name(format!("scd{}", std::env::consts::EXE_SUFFIX));
    anyhow::ensure!(
        exe.is_file(),
        "{}: no scd binary beside scd-dev (build it: cargo build -p scd-service --bin scd, with --release for a release scd-dev; or set SCD_BIN)",
        exe.display()
    );
    Ok(exe)
}

/// The `p` quantile (0..=1) of `xs` by nearest rank; sorts `xs`; 0 when empty.
pub fn percentile(xs: &mut [f64], p: f64) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    xs.sort_by(f64::total_cmp);
    xs[((xs.len() - 1) as f64 * p).round() as usize]
}

/// Texts from a JSONL file of `{"text": ...}` objects (`flag` names the option in errors).
pub(crate) fn read_jsonl_texts(path: &Path, flag: &str) -> anyhow::Result<Vec<String>> {
    let raw = std::fs::read_to_string(path).with_context(|| format!("{flag} {}", path.display()))?;
    scd_service::input::parse_jsonl_texts(&raw, flag)
}

/// A process the benches sample: this one or a child (`scd-dev bench-load`'s server).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Proc {
    /// This process.
    This,
    /// Another process by id.
    Pid(u32),
}

#[cfg(target_os = "linux")]
fn process(p: Proc) -> Option<procfs::process::Process> {
    match p {
        Proc::This => procfs::process::Process::myself(),
        Proc::Pid(pid) => procfs::process::Process::new(i32::try_from(pid).ok()?),
    }
    .ok()
}

/// Resident memory of a process in KiB (`VmRSS`; 0 when unknown or not on Linux).
pub(crate) fn rss_kib(p: Proc) -> u64 {
    #[cfg(target_os = "linux")]
    return process(p).and_then(|p| p.status().ok()?.vmrss).unwrap_or(0);
    #[cfg(not(target_os = "linux"))]
    return {
        let _ = p;
        0
    };
}

/// CPU seconds (user + system) a process has used so far (0 when unknown or
/// not on Linux), in the kernel's clock ticks per second.
pub(crate) fn cpu_seconds(p: Proc) -> f64 {
    #[cfg(target_os = "linux")]
    return process(p)
        .and_then(|p| p.stat().ok())
        .map(|s| (s.utime + s.stime) as f64 / procfs::ticks_per_second() as f64)
        .unwrap_or(0.0);
    #[cfg(not(target_os = "linux"))]
    return {
        let _ = p;
        0.0
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_os = "linux")]
    #[test]
    fn this_process_has_memory_and_cpu_time_and_a_missing_one_has_none() {
        let spin: u64 = (0..20_000_000u64).fold(0, |a, x| a.wrapping_add(x * x));
        assert!(spin > 0);
        assert!(rss_kib(Proc::This) > 1024, "{}", rss_kib(Proc::This));
        assert!(cpu_seconds(Proc::This) > 0.0);
        let me = rss_kib(Proc::Pid(std::process::id()));
        assert!(me > 1024, "{me}");
        assert_eq!(rss_kib(Proc::Pid(u32::MAX)), 0);
        assert_eq!(cpu_seconds(Proc::Pid(u32::MAX)), 0.0);
    }

    /// A test binary has no `scd` beside it (it lives in `deps/`): the
    /// error names where it looked and how to build one.
    #[test]
    fn a_missing_scd_binary_says_how_to_build_it() {
        if std::env::var_os("SCD_BIN").is_some() {
            return; // the caller chose one
        }
        let e = scd_exe().unwrap_err().to_string();
        let beside = std::env::current_exe().unwrap().with_file_name("scd");
        assert!(e.starts_with(&format!("{}: no scd binary beside scd-dev", beside.display())), "{e}");
        assert!(e.contains("cargo build -p scd-service --bin scd") && e.contains("SCD_BIN"), "{e}");
    }
}
