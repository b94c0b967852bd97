#![no_main]
//! `scd_service::fuzz::tool_input` under libFuzzer.

libfuzzer_sys::fuzz_target!(|data: &[u8]| scd_service::fuzz::tool_input(data));
