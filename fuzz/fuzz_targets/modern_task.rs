//! A 2026-07-28 task object read with the registry's field names keeps every other member
//! (`taskgate::props::modern_task`); never a panic.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    taskgate::props::modern_task(data, 86_400_000);
});
