//! The 2026 routing headers: encode/decode round-trip, and `check` of any headers against a
//! body (`taskgate::props::routing_headers`). Input: byte 0 picks what is sent; the rest is
//! cut at 0xFF into the body's method, its name, a raw Mcp-Method and a raw Mcp-Name.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let [flags, parts @ ..] = data {
        taskgate::props::routing_headers(*flags, parts);
    }
});
