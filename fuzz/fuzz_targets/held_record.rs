//! Held-session records and the sled expiry index on any bytes: decode never panics, what it
//! reads is bounded and round-trips, keys read back and sort by expiry
//! (`taskgate::props::held_record`).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    taskgate::props::held_record(data);
});
