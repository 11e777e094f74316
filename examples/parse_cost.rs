//! Cost of the edge's parse of a small `tools/call` body: `Message::parse` (envelope only) and
//! `Message::parse_checked` (the whole body validated: UTF-8, nesting). For instruction counts:
//!
//!     cargo build --example parse_cost
//!     valgrind --tool=callgrind target/debug/examples/parse_cost checked 100000
//!     valgrind --tool=callgrind target/debug/examples/parse_cost envelope 100000
//!
//! and divide the difference of the two totals by the count.

use bytes::Bytes;
use taskgate::jsonrpc::Message;

fn main() {
    let mut args = std::env::args().skip(1);
    let mode = args.next().unwrap_or_else(|| "checked".into());
    let n: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(100_000);
    let body = Bytes::from_static(
        br#"{"jsonrpc":"2.0","id":42,"method":"tools/call","params":{"name":"echo","arguments":{"message":"hello","count":3,"tags":["a","b"]},"_meta":{"progressToken":"p-42"}}}"#,
    );
    let mut ok = 0usize;
    for _ in 0..n {
        let parsed = match mode.as_str() {
            "envelope" => Message::parse(body.clone()),
            _ => Message::parse_checked(body.clone()),
        };
        ok += parsed.is_ok() as usize;
    }
    println!("{mode}: {ok} of {n} parsed ({} bytes each)", body.len());
}
