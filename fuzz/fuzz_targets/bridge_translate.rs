//! The bridge's 2026 ↔ 2025 translations on any JSON value keep what they must and drop what
//! the other era does not have (`taskgate::props::bridge_translate`); never a panic.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    taskgate::props::bridge_translate(data);
});
