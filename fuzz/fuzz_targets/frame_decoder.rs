//! Bytes from the network -> FrameDecoder -> (decompression) -> decode_request.
//! Any input must yield frames or errors, never a panic, and decoded requests must respect
//! the decoder's invariants.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use sluice_protocol::{
    peek_consistency, peek_execute_id, peek_query_text, BatchQuery, Compression, FrameDecoder,
    Request,
};

const MAX_BODY: u32 = 64 * 1024;

fuzz_target!(|data: &[u8]| {
    // The first byte picks the negotiated compression and the read chunk size, so the
    // corpus also explores partial reads.
    let Some((&sel, data)) = data.split_first() else {
        return;
    };
    let compression = match sel % 3 {
        0 => Compression::None,
        1 => Compression::Lz4,
        _ => Compression::Snappy,
    };
    let chunk = usize::from(sel / 3).max(1);
    let mut dec = FrameDecoder::new(MAX_BODY);
    let mut buf = BytesMut::new();
    for piece in data.chunks(chunk) {
        buf.extend_from_slice(piece);
        loop {
            let frame = match dec.decode(&mut buf) {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(e) => {
                    // The server answers and closes; the reply must be a well-formed frame.
                    let mut out = BytesMut::new();
                    e.encode_reply(&mut out);
                    assert_eq!(out[0], 0x84);
                    assert_eq!(out.len(), 9 + u32::from_be_bytes([out[5], out[6], out[7], out[8]]) as usize);
                    return;
                }
            };
            assert_eq!(frame.body.len(), frame.header.length as usize);
            let _ = peek_execute_id(&frame.header, &frame.body);
            let _ = peek_query_text(&frame.header, &frame.body);
            let _ = peek_consistency(&frame.header, &frame.body);
            if let Ok(req) = frame.into_request(compression, MAX_BODY as usize) {
                match req {
                    Request::Query { query, .. } | Request::Prepare { query } => {
                        assert!(std::str::from_utf8(&query).is_ok());
                    }
                    Request::Batch(b) => {
                        for e in &b.entries {
                            if let BatchQuery::Text(t) = &e.statement {
                                assert!(std::str::from_utf8(t).is_ok());
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
    }
});
