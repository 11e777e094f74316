//! The edge's JSON-RPC envelope parser on any body: accepted ⇒ one valid JSON object whose id
//! round-trips (`taskgate::props::envelope`); never a panic.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    taskgate::props::envelope(data);
});
