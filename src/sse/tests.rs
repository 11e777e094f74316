//! Tests of the SSE codec: the decoder's line and limit rules, encode/decode round trips, the
//! client side's keep-alives.

use super::*;
use futures_util::StreamExt;
use http_body_util::Full;
use std::time::Duration;

#[tokio::test]
async fn round_trip_keeps_fields() {
    let wire = "id: 7\ndata: \n\nevent: message\nid: s1-8\nretry: 2500\ndata: {\"jsonrpc\":\"2.0\"}\n\n: comment\n\ndata: a\r\ndata: b\rx-unknown: 1\n\n";
    let events: Vec<Event> = decode(Full::new(Bytes::from(wire)), "t".into(), 1024)
        .map(|e| e.unwrap())
        .collect()
        .await;
    assert_eq!(events.len(), 3);
    assert_eq!(events[0].id.as_deref(), Some("7"));
    assert_eq!(events[0].data.as_deref(), Some(""));
    assert_eq!(events[1].event.as_deref(), Some("message"));
    assert_eq!(events[1].retry, Some(2500));
    assert_eq!(events[2].data.as_deref(), Some("a\nb"));
    let again: String = events
        .iter()
        .map(|e| String::from_utf8(encode(e).to_vec()).unwrap())
        .collect();
    let reparsed: Vec<Event> = decode(Full::new(Bytes::from(again)), "t".into(), 1024)
        .map(|e| e.unwrap())
        .collect()
        .await;
    assert_eq!(events, reparsed);
}

#[test]
fn decoder_handles_split_chunks_and_colonless_lines() {
    let mut d = Decoder::default();
    let mut out = Vec::new();
    for chunk in ["id: 1\r", "\ndata", "\n\nda", "ta: x\n", "\n"] {
        d.feed(chunk.as_bytes(), &mut out).unwrap();
    }
    assert_eq!(out.len(), 2);
    assert_eq!(out[0].id.as_deref(), Some("1"));
    assert_eq!(out[0].data.as_deref(), Some(""));
    assert_eq!(out[1].data.as_deref(), Some("x"));
    assert_eq!(out[1].id, None);
}

/// Every split of the input into two chunks, and the input fed byte by byte, decode to the
/// same events as the whole input at once (CR/LF pairs, BOM, colonless lines, multi-byte
/// UTF-8 and invalid UTF-8 across the split).
#[test]
fn decoder_same_events_at_every_chunk_split() {
    let wire: &[u8] = b"\xEF\xBB\xBFid: 1\r\ndata\r\n\r\n: c\rdata: a\xC3\xA9\rdata: b\xFF\n\nevent: e\nretry: 5\r\r\
        data:x\ndata: {\"k\":\"\xE2\x82\xAC\"}\r\nid\n\ndata: tail";
    let decode_all = |chunks: &[&[u8]]| {
        let mut d = Decoder::new(1024);
        let mut out = Vec::new();
        for c in chunks {
            d.feed(c, &mut out).unwrap();
        }
        out
    };
    let whole = decode_all(&[wire]);
    assert_eq!(whole.len(), 4, "{whole:?}");
    assert_eq!(whole[0].id.as_deref(), Some("1"));
    assert_eq!(whole[0].data.as_deref(), Some(""));
    assert_eq!(whole[1].data.as_deref(), Some("a\u{e9}\nb\u{FFFD}"));
    assert_eq!(whole[2].retry, Some(5));
    assert_eq!(whole[3].data.as_deref(), Some("x\n{\"k\":\"\u{20AC}\"}"));
    assert_eq!(whole[3].id.as_deref(), Some(""));
    for at in 0..=wire.len() {
        let (a, b) = wire.split_at(at);
        assert_eq!(decode_all(&[a, b]), whole, "split at {at}");
    }
    let bytes: Vec<&[u8]> = wire.chunks(1).collect();
    assert_eq!(decode_all(&bytes), whole, "byte by byte");
}

/// A line without an end (no newline ever) and an event of many small lines without a blank
/// line both fail once they pass the limit, and stay failed; the buffers are released.
#[test]
fn decoder_caps_line_and_event_size() {
    let mut d = Decoder::new(1024);
    let mut out = Vec::new();
    d.feed(b"data: ok\n\n", &mut out).unwrap();
    let mut failed = false;
    for _ in 0..100 {
        if d.feed(&[b'x'; 100], &mut out).is_err() {
            failed = true;
            break;
        }
    }
    assert!(failed, "a newline-free line must hit the cap");
    assert!(d.buf.capacity() <= 1024 + 100);
    assert_eq!(out.len(), 1);
    assert_eq!(d.feed(b"\n\n", &mut out), Err(Oversize { limit: 1024 }));

    let mut d = Decoder::new(1024);
    let mut out = Vec::new();
    let mut failed = false;
    for _ in 0..1000 {
        if d.feed(b"data: 0123456789\n", &mut out).is_err() {
            failed = true;
            break;
        }
    }
    assert!(failed, "an event without end must hit the cap");
    assert!(d.current.data.is_none());
    assert!(out.is_empty());

    // Exactly at the limit is fine: a 1023-byte line, 1024 bytes with its newline.
    let mut d = Decoder::new(1024);
    let mut out = Vec::new();
    let mut line = b"data:".to_vec();
    line.resize(1023, b'y');
    line.extend_from_slice(b"\n\n");
    d.feed(&line, &mut out).unwrap();
    assert_eq!(out.len(), 1);
}

/// `decode` yields the events before the oversize line, then `Err(Oversize)`, then ends.
#[tokio::test]
async fn decode_reports_oversize_after_earlier_events() {
    let mut wire = b"data: first\n\ndata: ".to_vec();
    wire.resize(5000, b'z');
    let items: Vec<Result<Event, Cut>> = decode(Full::new(Bytes::from(wire)), "t".into(), 1024)
        .collect()
        .await;
    assert_eq!(items.len(), 2, "{items:?}");
    assert_eq!(items[0].as_ref().unwrap().data.as_deref(), Some("first"));
    assert_eq!(items[1], Err(Cut::Oversize(Oversize { limit: 1024 })));
}

#[tokio::test(start_paused = true)]
async fn keepalive_on_idle() {
    let events: EventStream = Box::pin(futures_util::stream::pending());
    let mut ka = KeepAlive::new(events, Duration::from_millis(50));
    let first = ka.next().await.unwrap().unwrap();
    assert_eq!(&first[..], KEEPALIVE_COMMENT);
}

/// Events that are ready when the upstream is pending go out at once, together, also after the
/// first chunk of the stream (they used to be held back for one more turn of the scheduler).
#[tokio::test(start_paused = true)]
async fn keepalive_sends_ready_events_at_once() {
    let mut step = 0;
    let events: EventStream = Box::pin(futures_util::stream::poll_fn(move |_cx| {
        step += 1;
        match step {
            1 => std::task::Poll::Ready(Some(Event::message("1".into()))),
            3 | 4 => std::task::Poll::Ready(Some(Event::message(step.to_string()))),
            _ => std::task::Poll::Pending,
        }
    }));
    let mut ka = KeepAlive::new(events, Duration::from_secs(60));
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    let mut poll = || match ka.poll_next_unpin(&mut cx) {
        std::task::Poll::Ready(Some(Ok(b))) => Some(String::from_utf8(b.to_vec()).unwrap()),
        other => {
            assert!(other.is_pending(), "{other:?}");
            None
        }
    };
    assert_eq!(poll().as_deref(), Some("event: message\ndata: 1\n\n"));
    assert_eq!(
        poll().as_deref(),
        Some("event: message\ndata: 3\n\nevent: message\ndata: 4\n\n")
    );
    assert_eq!(poll(), None);
}

/// `feed_bytes` (in place, the chunk's lines not copied) decodes as `feed` does, whatever the
/// chunks: events split across chunks, an incomplete line at a chunk's end, CR LF split.
#[test]
fn feed_bytes_same_as_feed() {
    let wire: &[u8] = b"\xEF\xBB\xBFevent: message\r\ndata: a\r\n\r\nevent: other\ndata: b\n\nid: 3\rdata: c\r\rdata: d\n\n";
    let mut whole = Decoder::new(1024);
    let mut expected = Vec::new();
    whole.feed(wire, &mut expected).unwrap();
    assert_eq!(expected.len(), 4);
    for a in 0..wire.len() {
        for b in a..wire.len() {
            let mut d = Decoder::new(1024);
            let mut out = Vec::new();
            for chunk in [&wire[..a], &wire[a..b], &wire[b..]] {
                d.feed_bytes(Bytes::copy_from_slice(chunk), &mut out)
                    .unwrap();
            }
            assert_eq!(out, expected, "split at {a} and {b}");
        }
    }
}

/// Several `data` lines (one colonless, so empty) are joined with `\n` in order, also when the
/// event arrives in pieces; an event of many short lines keeps them all.
#[test]
fn decoder_joins_data_lines() {
    let wire: &[u8] = b"data: one\ndata\ndata:  two\ndata: three\n\ndata: alone\n\n";
    for at in 0..=wire.len() {
        let (a, b) = wire.split_at(at);
        let mut d = Decoder::new(1024);
        let mut out = Vec::new();
        d.feed(a, &mut out).unwrap();
        d.feed(b, &mut out).unwrap();
        let data: Vec<_> = out.iter().map(|e| e.data.as_deref()).collect();
        assert_eq!(
            data,
            [Some("one\n\n two\nthree"), Some("alone")],
            "split at {at}"
        );
    }
    let mut d = Decoder::new(1 << 20);
    let mut out = Vec::new();
    for _ in 0..10_000 {
        d.feed(b"data: x\n", &mut out).unwrap();
    }
    d.feed(b"\n", &mut out).unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].data.as_ref().map(|d| d.len()), Some(10_000 * 2 - 1));
}

/// `encode` writes one `data:` line per line of `data` (empty ones too), fields in the order
/// event, id, retry, data, and the blank line that ends the event.
#[test]
fn encode_writes_every_field() {
    let ev = Event {
        event: Some("message".into()),
        id: Some("s1-8".into()),
        retry: Some(2500),
        data: Some("a\n\nb\n".into()),
        ..Default::default()
    };
    assert_eq!(
        &encode(&ev)[..],
        b"event: message\nid: s1-8\nretry: 2500\ndata: a\ndata: \ndata: b\ndata: \n\n"
    );
    assert_eq!(&encode(&Event::default())[..], b"\n");
}

/// A `\r` or `\r\n` in `data` ends a `data:` line as `\n` does (an SSE parser ends a line at
/// each): written raw, the rest of the data was read as a field of its own. Decoding gives the
/// data back with `\n` for each.
#[test]
fn encode_ends_a_data_line_at_a_carriage_return_too() {
    let ev = Event {
        data: Some("{\"a\":1,\r\"b\":2,\r\n\"c\":3}\r".into()),
        ..Default::default()
    };
    let wire = encode(&ev);
    assert_eq!(
        &wire[..],
        b"data: {\"a\":1,\ndata: \"b\":2,\ndata: \"c\":3}\ndata: \n\n"
    );
    let mut d = Decoder::new(1 << 20);
    let mut out = Vec::new();
    d.feed(&wire, &mut out).unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(
        out[0].data.as_deref(),
        Some("{\"a\":1,\n\"b\":2,\n\"c\":3}\n")
    );
}

/// After a large line (here a 4 MiB comment, which no event even carries) the decoder does not
/// go on decoding into the allocation that held it: the events decoded later are slices of a
/// small buffer, so holding one (a relay queue to a slow client) does not keep megabytes alive.
/// (It did: every later event was a slice of the grown buffer, until its spare capacity was
/// used up.)
#[test]
fn events_after_a_large_line_do_not_hold_its_buffer() {
    let mut d = Decoder::new(16 << 20);
    let mut out = Vec::new();
    let mut wire = vec![b':'];
    wire.resize(4 << 20, b'c');
    wire.extend_from_slice(b"\ndata: x\n\n");
    for chunk in wire.chunks(16 * 1024) {
        d.feed(chunk, &mut out).unwrap();
    }
    d.feed(b"data: y\n\n", &mut out).unwrap();
    drop(d);
    let later = out.pop().unwrap();
    assert_eq!(later.data.as_deref(), Some("y"));
    drop(out);
    // The only handle left on the later event's buffer: its capacity is what it keeps alive.
    let held = later
        .data
        .unwrap()
        .into_bytes()
        .try_into_mut()
        .expect("unique");
    assert!(
        held.capacity() < 64 * 1024,
        "holds {} bytes",
        held.capacity()
    );
}

/// A detached event has the same fields as the decoded one, none of them sharing the decoded
/// chunk's buffer (an event the upgrade layer keeps must not pin the upstream's read buffer).
#[test]
fn a_detached_event_keeps_no_slice_of_the_chunk() {
    let chunk = Bytes::from_static(b"event: progress\nid: 7\ndata: {\"a\":1}\n\n");
    let range = chunk.as_ptr() as usize..chunk.as_ptr() as usize + chunk.len();
    let mut d = Decoder::new(1024);
    let mut out = Vec::new();
    // The first bytes go through the BOM check (copied); later whole lines are read in place.
    d.feed_bytes(Bytes::from_static(b": open\n"), &mut out)
        .unwrap();
    d.feed_bytes(chunk.clone(), &mut out).unwrap();
    let ev = out.pop().expect("one event");
    let in_place = ev.data.as_ref().unwrap();
    assert!(
        range.contains(&(in_place.as_ptr() as usize)),
        "decoded in place"
    );
    let kept = ev.clone().detached();
    assert_eq!(
        (&kept.event, &kept.data, &kept.id, kept.retry),
        (&ev.event, &ev.data, &ev.id, ev.retry)
    );
    for field in [&kept.event, &kept.data, &kept.id].into_iter().flatten() {
        assert!(
            !range.contains(&(field.as_ptr() as usize)),
            "{field} is a slice of the chunk"
        );
    }
}

/// Review 18b #8: the transport's own error event is known as such after `detached` (which
/// copies every field into an allocation of its own; before, the mark was the address of its
/// type's text and was lost there), and goes out as a plain `data:` event, the mark not on the
/// wire (before, as `event: message`). A decoded event, or any other, is not one.
#[test]
fn a_detached_transport_error_is_still_one() {
    let body = r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32603,"message":"too big"}}"#;
    let ev = Event::transport_error(body.to_string(), crate::sse::TransportFailure::Invalid);
    assert!(ev.is_transport_error());
    let detached = ev.clone().detached();
    assert!(detached.is_transport_error(), "kept by detached");
    assert_eq!(detached, ev);
    let wire = format!("data: {body}\n\n");
    assert_eq!(&encode(&detached)[..], wire.as_bytes());
    assert!(!Event::message(body.to_string()).is_transport_error());
    let mut decoder = Decoder::default();
    let mut out = Vec::new();
    decoder.feed(wire.as_bytes(), &mut out).unwrap();
    assert_eq!(out.len(), 1);
    assert!(!out[0].is_transport_error(), "never decoded from the wire");
    assert!(!out[0].clone().detached().is_transport_error());
}
