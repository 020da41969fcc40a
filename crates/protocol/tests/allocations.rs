//! Counts heap allocations on the hot paths with a counting global allocator: the rejection
//! paths must not allocate at all, and decoding an EXECUTE allocates only its values `Vec`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use bytes::{Bytes, BytesMut};
use sluice_protocol::error::OperationType;
use sluice_protocol::preencoded::{PreencodedErrors, OVERLOADED, WRITE_DEADLINE};
use sluice_protocol::response::encode_error;
use sluice_protocol::wire::*;
use sluice_protocol::{Compression, Consistency, FrameDecoder, Request};

struct Counting;

thread_local! {
    // Per thread, so tests running in parallel do not see each other's allocations.
    static ALLOCS: Cell<usize> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations<R>(f: impl FnOnce() -> R) -> (usize, R) {
    let before = ALLOCS.with(Cell::get);
    let r = f();
    (ALLOCS.with(Cell::get) - before, r)
}

#[test]
fn rejections_do_not_allocate() {
    let pre = PreencodedErrors::new();
    let mut out = BytesMut::with_capacity(64 * 1024);
    let (n, ()) = allocations(|| {
        for stream in 0..100 {
            pre.overloaded.append(&mut out, stream);
            pre.timeout(OperationType::Write).append_with_consistency(
                &mut out,
                stream,
                Consistency::Quorum,
            );
            pre.rate_limit(OperationType::Read, true)
                .append(&mut out, stream);
            pre.rate_limit(OperationType::Write, false)
                .append(&mut out, stream);
        }
    });
    assert_eq!(n, 0, "pre-encoded rejections allocated");

    // Encoding an ErrorResponse value directly does not allocate either.
    let (n, ()) = allocations(|| {
        encode_error(&mut out, 5, &OVERLOADED, Compression::Lz4);
        encode_error(&mut out, 6, &WRITE_DEADLINE, Compression::None);
    });
    assert_eq!(n, 0, "error encoding allocated");
}

#[test]
fn execute_decode_allocates_only_the_values_vec() {
    let mut body = BytesMut::new();
    put_short_bytes(&mut body, &[0x11; 16]);
    put_consistency(&mut body, Consistency::LocalQuorum);
    put_u8(&mut body, 0x01 | 0x04 | 0x10 | 0x20);
    put_short(&mut body, 3);
    put_bytes(&mut body, Some(&42i64.to_be_bytes()));
    put_bytes(&mut body, Some(b"some text"));
    put_int(&mut body, -2);
    put_int(&mut body, 5000);
    put_consistency(&mut body, Consistency::LocalSerial);
    put_long(&mut body, 1);
    let mut frame = BytesMut::with_capacity(4096);
    frame.extend_from_slice(&[0x04, 0, 0, 9, 0x0A]);
    frame.extend_from_slice(&(body.len() as u32).to_be_bytes());
    frame.extend_from_slice(&body);

    let mut dec = FrameDecoder::default();
    let (n, req) = allocations(|| {
        let f = dec.decode(&mut frame).unwrap().unwrap();
        f.into_request(Compression::Lz4, 1 << 20).unwrap()
    });
    let Request::Execute { params, .. } = req else {
        panic!("not an EXECUTE")
    };
    assert_eq!(params.values.len(), 3);
    // split_to/freeze of a BytesMut may promote it to a shared buffer once (one small
    // allocation for the shared header); the values Vec is the other.
    assert!(n <= 2, "EXECUTE decode made {n} allocations");

    // Decoding an already split body: exactly the values Vec.
    let body = body.freeze();
    let header = sluice_protocol::FrameHeader {
        version: 4,
        flags: 0,
        stream: 9,
        opcode: sluice_protocol::Opcode::Execute,
        length: body.len() as u32,
    };
    let b2: Bytes = body.clone();
    let (n, _) = allocations(|| sluice_protocol::decode_request(&header, b2).unwrap());
    assert_eq!(n, 1, "decode_request of EXECUTE made {n} allocations");
}
