#![no_main]
//! `scd_engine::fuzz::context_json` under libFuzzer.

libfuzzer_sys::fuzz_target!(|data: &[u8]| scd_engine::fuzz::context_json(data));
