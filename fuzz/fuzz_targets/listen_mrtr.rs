//! A held session's `subscriptions/listen` messages and MRTR `input_required` answers on any
//! text (`taskgate::props::listen_mrtr`). Input: byte 0 picks the request id and MRTR round
//! or task; the rest is the message.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let [flags, body @ ..] = data {
        taskgate::props::listen_mrtr(*flags, body);
    }
});
