//! The bridge's whole-message 2026 → 2025 translations and error-code mapping on any text map
//! exactly what they must (`taskgate::props::bridge_legacy`); never a panic.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    taskgate::props::bridge_legacy(data);
});
