//! The config loader on any text: a config or an error, never a panic
//! (`taskgate::props::config`).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        taskgate::props::config(text);
    }
});
