//! A held session's request on any body goes upstream as a 2026-07-28 request that keeps its
//! id, its params and agreeing routing headers (`taskgate::props::held_request`).
//! Input: byte 0 picks the held session and the client's stale headers; the rest is the body.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let [flags, body @ ..] = data {
        taskgate::props::held_request(*flags, body);
    }
});
