//! A 2026 upstream's reply to a held session's request reaches the 2025 client in 2025 form
//! (`taskgate::props::held_answer`). Input: byte 0 picks the HTTP status and JSON or SSE
//! (events cut at 0xFF); the rest is the body.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let [flags, body @ ..] = data {
        taskgate::props::held_answer(*flags, body);
    }
});
