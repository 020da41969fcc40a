//! How long a request's bytes waited in the kernel before the reader took them.
//!
//! Admission sees a request only once its connection's reader has read it. When the shard is
//! saturated, the excess also waits where no queue of the server can see it: in the kernel's
//! receive buffer, behind what the reader has not yet reached. The loop lag probe estimates
//! part of that wait; the kernel knows all of it. With `SO_TIMESTAMPNS` on, every `recvmsg`
//! returns the time the newest segment it read arrived, so every byte of that read waited at
//! least `now - that time` unread. The reader counts it as queueing, and a backlog hidden in
//! the socket becomes a standing queue delay that admission sheds instead of ignoring.

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::{BufMut, BytesMut};
use tokio::io::Interest;
use tokio::net::tcp::OwnedReadHalf;

/// Asks the kernel to stamp received data (`SO_TIMESTAMPNS`). Fails on a socket that does not
/// support it; the reader then reads without stamps.
pub fn enable(fd: RawFd) -> io::Result<()> {
    let on: libc::c_int = 1;
    // SAFETY: `on` outlives the call and its size is passed.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_TIMESTAMPNS,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// One read into `buf`'s spare capacity, and how long the newest byte read had waited in the
/// kernel (zero when the kernel gave no stamp, or the clock stepped back).
pub async fn read_stamped(rd: &OwnedReadHalf, buf: &mut BytesMut) -> io::Result<(usize, Duration)> {
    let stream = rd.as_ref();
    loop {
        stream.readable().await?;
        match stream.try_io(Interest::READABLE, || recv_stamped(stream.as_raw_fd(), buf)) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            other => return other,
        }
    }
}

/// Room made for a read when the buffer has none.
const MIN_READ: usize = 4096;

/// Control buffer for one `SCM_TIMESTAMPNS` message (a `timespec`), 8-byte aligned.
#[repr(C, align(8))]
struct ControlBuf([u8; 64]);

fn recv_stamped(fd: RawFd, buf: &mut BytesMut) -> io::Result<(usize, Duration)> {
    // A read into no room would return 0, which means end of stream.
    if buf.capacity() == buf.len() {
        buf.reserve(MIN_READ);
    }
    let spare = buf.spare_capacity_mut();
    let mut iov = libc::iovec {
        iov_base: spare.as_mut_ptr().cast(),
        iov_len: spare.len(),
    };
    let mut control = MaybeUninit::<ControlBuf>::zeroed();
    // SAFETY: an all-zero msghdr is valid; the pointers set below outlive the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of::<ControlBuf>() as _;
    // SAFETY: `msg` describes writable memory that lives until the call returns.
    let n = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_DONTWAIT) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let n = n as usize;
    // SAFETY: the kernel initialised `n` bytes of the spare capacity.
    unsafe { buf.advance_mut(n) };
    Ok((n, stamp_age(&msg)))
}

/// The age of the `SCM_TIMESTAMPNS` stamp in `msg`, if it carries one.
fn stamp_age(msg: &libc::msghdr) -> Duration {
    // SAFETY: walks the control messages the kernel wrote, within `msg_controllen`.
    let mut cmsg = unsafe { libc::CMSG_FIRSTHDR(msg) };
    while !cmsg.is_null() {
        // SAFETY: `cmsg` points at a complete header inside the control buffer.
        let hdr = unsafe { &*cmsg };
        if hdr.cmsg_level == libc::SOL_SOCKET && hdr.cmsg_type == libc::SCM_TIMESTAMPNS {
            // SAFETY: an SCM_TIMESTAMPNS message carries one timespec (maybe unaligned).
            let ts: libc::timespec =
                unsafe { std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast()) };
            return age_of(ts, SystemTime::now());
        }
        // SAFETY: as above.
        cmsg = unsafe { libc::CMSG_NXTHDR(msg, cmsg) };
    }
    Duration::ZERO
}

/// `now - stamp`, or zero if the stamp is in the future (the clock was stepped back). The
/// kernel stamps in `CLOCK_REALTIME`, the clock `SystemTime` reads.
fn age_of(stamp: libc::timespec, now: SystemTime) -> Duration {
    let (Ok(secs), Ok(nanos)) = (u64::try_from(stamp.tv_sec), u32::try_from(stamp.tv_nsec)) else {
        return Duration::ZERO;
    };
    now.duration_since(UNIX_EPOCH + Duration::new(secs, nanos))
        .unwrap_or(Duration::ZERO)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A client socket and the server's end of it, nonblocking for tokio.
    fn connected() -> (std::net::TcpStream, std::net::TcpStream) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let client =
            std::net::TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        let (server, _) = listener.accept().expect("accept");
        server.set_nonblocking(true).expect("nonblocking");
        (client, server)
    }

    #[test]
    fn a_stamp_in_the_future_is_no_wait() {
        let ts = |s, ns| libc::timespec {
            tv_sec: s,
            tv_nsec: ns,
        };
        let at = |s, ns| UNIX_EPOCH + Duration::new(s, ns);
        assert_eq!(age_of(ts(10, 0), at(10, 500)), Duration::from_nanos(500));
        assert_eq!(
            age_of(ts(9, 999_999_999), at(10, 1)),
            Duration::from_nanos(2)
        );
        assert_eq!(age_of(ts(11, 0), at(10, 0)), Duration::ZERO);
    }

    #[tokio::test]
    async fn a_full_buffer_grows_instead_of_reading_nothing() {
        let (mut client, server) = connected();
        let (rd, _wr) = tokio::net::TcpStream::from_std(server)
            .expect("tokio stream")
            .into_split();
        client.write_all(b"more").expect("write");
        let mut buf = BytesMut::with_capacity(8);
        buf.extend_from_slice(&[0; 8]);
        buf.truncate(buf.capacity());
        let (n, _) = read_stamped(&rd, &mut buf).await.expect("read");
        assert_eq!(n, 4, "read the bytes, not an end of stream");
        assert!(buf.ends_with(b"more"));
    }

    #[tokio::test]
    async fn bytes_left_unread_report_how_long_they_waited() {
        let (mut client, server) = connected();
        enable(server.as_raw_fd()).expect("SO_TIMESTAMPNS");
        let (rd, _wr) = tokio::net::TcpStream::from_std(server)
            .expect("tokio stream")
            .into_split();
        client.write_all(b"first").expect("write");
        std::thread::sleep(Duration::from_millis(60));
        let mut buf = BytesMut::with_capacity(64);
        let (n, waited) = read_stamped(&rd, &mut buf).await.expect("read");
        assert_eq!(&buf[..n], b"first");
        assert!(waited >= Duration::from_millis(50), "waited {waited:?}");
        // Read at once: no wait to speak of.
        client.write_all(b"second").expect("write");
        let (n, waited) = read_stamped(&rd, &mut buf).await.expect("read");
        assert_eq!(&buf[5..5 + n], b"second");
        assert!(waited < Duration::from_millis(50), "waited {waited:?}");
    }
}
