//! An upstream's chunked body on any bytes: the first bytes of the input pick where the reads
//! are cut, the rest is the body; any cutting gives the same data and ending
//! (`taskgate::props::chunked_framing`).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let (cuts, wire) = data.split_at(data.len().min(8));
    let cuts: Vec<usize> = cuts.iter().map(|&b| b as usize * 7).collect();
    taskgate::props::chunked_framing(wire, &cuts);
});
