#![no_main]
//! `scd_engine::fuzz::handoff` under libFuzzer.

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    scd_engine::fuzz::handoff(data);
});
