#![no_main]
//! `scd_service::fuzz::grpc_convert` under libFuzzer.

libfuzzer_sys::fuzz_target!(|data: &[u8]| scd_service::fuzz::grpc_convert(data));
