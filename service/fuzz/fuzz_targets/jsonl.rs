#![no_main]
//! `scd_service::fuzz::jsonl` under libFuzzer.

libfuzzer_sys::fuzz_target!(|data: &[u8]| scd_service::fuzz::jsonl(data));
