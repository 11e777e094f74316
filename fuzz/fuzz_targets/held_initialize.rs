//! The held `initialize` answer from any `server/discover` result
//! (`taskgate::props::held_initialize`). Input: byte 0 picks the requested protocolVersion
//! and whether the upstream has the tasks extension; the rest is the discover result.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let [flags, body @ ..] = data {
        taskgate::props::held_initialize(*flags, body);
    }
});
