//! The terminal-status rewrite of both eras on any upstream message: only the targeted task's
//! status members change (`taskgate::props::status_rewrite`); never a panic.
//! Input: byte 0 picks the task's place, byte 1 the recorded status, byte 2 the recorded
//! `statusMessage` (none, or a short text); the rest is the message.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let [at, status, message, body @ ..] = data {
        let message = [None, Some("done"), Some("a\"b\u{e9}")][*message as usize % 3];
        taskgate::props::status_rewrite(body, *at, *status, message);
    }
});
