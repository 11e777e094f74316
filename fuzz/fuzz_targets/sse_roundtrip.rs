//! SSE encode → decode is the identity (`taskgate::props::sse_roundtrip`): the input is split
//! at 0xFF bytes into fields, the first byte of each picking the field.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let fields: Vec<(u8, String)> = data
        .split(|&b| b == 0xFF)
        .filter(|f| !f.is_empty())
        .map(|f| (f[0], String::from_utf8_lossy(&f[1..]).into_owned()))
        .collect();
    taskgate::props::sse_roundtrip(&fields);
});
