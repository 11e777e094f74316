//! The SSE decoder on any stream: the first bytes of the input pick the chunk boundaries, the
//! rest is the stream; any chunking yields the same events (`taskgate::props::sse_chunking`).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let (cuts, wire) = data.split_at(data.len().min(8));
    let cuts: Vec<usize> = cuts.iter().map(|&b| b as usize * 7).collect();
    taskgate::props::sse_chunking(wire, &cuts, 256);
});
