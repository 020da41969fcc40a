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
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::{BufMut, BytesMut};
use sluice_overload::Arrival;
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

/// Bytes received on `stream` and not yet read (`FIONREAD`): the part of a connection's
/// backlog that waits in the kernel.
pub fn unread_bytes(stream: &tokio::net::TcpStream) -> io::Result<usize> {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one c_int through the pointer, which outlives the call.
    let rc = unsafe {
        libc::ioctl(
            stream.as_raw_fd(),
            libc::FIONREAD,
            &mut n as *mut libc::c_int,
        )
    };
    if rc == 0 {
        Ok(usize::try_from(n).unwrap_or(0))
    } else {
        Err(io::Error::last_os_error())
    }
}

/// What one socket read returned, and what it tells of when its bytes arrived.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Read {
    /// Bytes read (0: end of stream).
    pub len: usize,
    /// How long the newest byte read had waited in the kernel (zero without a stamp, or
    /// when the clock stepped back).
    pub newest_waited: Duration,
    /// The socket had nothing to read when the reader came to it: it waited for these bytes,
    /// so they arrived while it was idle, not while it was busy.
    pub idle_before: bool,
    /// The socket gives receive stamps (`newest_waited` is the kernel's).
    pub stamped: bool,
}

/// One read into `buf`'s spare capacity, with the kernel's stamp of its newest byte.
pub async fn read_stamped(rd: &OwnedReadHalf, buf: &mut BytesMut) -> io::Result<Read> {
    let stream = rd.as_ref();
    let mut idle_before = false;
    loop {
        // `try_io` first, without awaiting: it tells whether the bytes were already there.
        match stream.try_io(Interest::READABLE, || recv_stamped(stream.as_raw_fd(), buf)) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                idle_before = true;
                stream.readable().await?;
            }
            Err(e) => return Err(e),
            Ok((len, newest_waited)) => {
                return Ok(Read {
                    len,
                    newest_waited,
                    idle_before,
                    stamped: true,
                })
            }
        }
    }
}

/// When each frame of a socket read arrived, as well as the reader can tell.
///
/// The kernel stamps only the newest byte of a read. Stamping every frame with it made a
/// large read look young: its first frames had waited for as long as the reader took to
/// work through the read before, but counted as just arrived, so the queue delay's minimum
/// stayed under target and a saturated shard was never seen as overloaded. TCP delivers in
/// order, so a read's bytes all arrived after the bytes of the read before, and when that
/// read emptied the socket, after that read too. Between that bound and the newest byte's
/// stamp, a frame is taken to have arrived in proportion to where it ends in the read: the
/// client's bytes come at an even rate while a backlog builds, which is when this matters.
/// A read that found the socket empty and waited is not spread: its bytes came while the
/// reader was idle, and an idle gap is no queueing.
#[derive(Clone, Copy, Debug)]
pub struct ReadArrivals {
    /// The arrival of the read's newest byte.
    newest: Instant,
    /// `newest` is the kernel's receive stamp (else the instant of a read or a pause).
    received: bool,
    /// How much earlier than `newest` its first byte may have arrived (nanoseconds).
    span_ns: u64,
    /// Bytes of the buffer from before this read (the start of an incomplete frame).
    carried: usize,
    /// Bytes of this read.
    len: usize,
    /// Bytes taken from the buffer since this read.
    taken: usize,
    /// The bytes read ahead behind this read's (see [`Self::read_ahead`]).
    ahead: ReadAhead,
}

/// Bytes a reader read ahead into its buffer behind a read's bytes (a non-blocking read
/// without a stamp, `crate::read_ahead`), until the reader takes them.
#[derive(Clone, Copy, Debug)]
struct ReadAhead {
    /// Where they start, in bytes taken since the read (`usize::MAX`: none).
    from: usize,
    /// How many.
    len: usize,
    /// The earliest their first byte can have arrived: the arrival of the byte before.
    earliest: Instant,
    /// When the latest read-ahead read them.
    read_at: Instant,
}

impl ReadAhead {
    /// No bytes read ahead.
    fn none(at: Instant) -> ReadAhead {
        ReadAhead {
            from: usize::MAX,
            len: 0,
            earliest: at,
            read_at: at,
        }
    }

    /// The arrival of the byte `into` bytes into them, spread between `earliest` and
    /// `read_at` as a read's bytes are between its bounds.
    fn arrival(&self, into: usize) -> Instant {
        let into = into.min(self.len);
        let span = self.read_at.saturating_duration_since(self.earliest);
        let before = span.as_nanos() * (self.len - into) as u128 / self.len.max(1) as u128;
        self.read_at - Duration::from_nanos(before as u64)
    }
}

impl ReadArrivals {
    /// Every frame arrived at `at` (a read without a stamp, or after a pause).
    pub fn all_at(at: Instant) -> Self {
        ReadArrivals {
            newest: at,
            received: false,
            span_ns: 0,
            carried: 0,
            len: 0,
            taken: 0,
            ahead: ReadAhead::none(at),
        }
    }

    /// A read of `len` bytes appended to `carried` bytes already buffered, whose newest byte
    /// the kernel stamped at `newest` and whose first byte arrived no earlier than `span`
    /// before it.
    pub fn spread(newest: Instant, span: Duration, carried: usize, len: usize) -> Self {
        ReadArrivals {
            newest,
            received: true,
            span_ns: u64::try_from(span.as_nanos()).unwrap_or(u64::MAX),
            carried,
            len,
            taken: 0,
            ahead: ReadAhead::none(newest),
        }
    }

    /// The reader read `read` bytes ahead into its buffer at `now`, behind `unread` bytes it
    /// has not taken yet (see [`Self::next_arrival`] for when their frames arrive).
    pub fn read_ahead(&mut self, unread: usize, read: usize, now: Instant) {
        if read == 0 {
            return;
        }
        let end = self.taken.saturating_add(unread);
        if self.ahead.from == usize::MAX {
            self.ahead = ReadAhead {
                from: end,
                len: read,
                // After the newest byte of the read before (or the end of a pause).
                earliest: self.newest,
                read_at: now,
            };
        } else {
            debug_assert_eq!(
                self.ahead.from + self.ahead.len,
                end,
                "bytes read ahead follow the bytes read ahead before them"
            );
            self.ahead.len += read;
            self.ahead.read_at = now;
        }
    }

    /// The reader paused over an in-flight cap and resumed at `at`: the frames still
    /// buffered waited in the client's queue, not the shard's, so none counts from before
    /// `at`; bytes read ahead stay read ahead.
    pub fn resumed(self, at: Instant) -> Self {
        let mut after = Self::all_at(at);
        let a = self.ahead;
        if a.from != usize::MAX {
            // Of the bytes read ahead, those already taken are gone from the buffer.
            let taken = self.taken.saturating_sub(a.from).min(a.len);
            after.ahead = ReadAhead {
                from: a.from.saturating_sub(self.taken),
                len: a.len - taken,
                earliest: a.arrival(taken).max(at),
                read_at: a.read_at.max(at),
            };
        }
        after
    }

    /// The arrival of the next frame, `frame_len` bytes long (header included), taken from
    /// the buffer: the arrival of its last byte.
    #[inline]
    pub fn next_frame(&mut self, frame_len: usize) -> Instant {
        self.taken = self.taken.saturating_add(frame_len);
        if self.span_ns == 0 || self.len == 0 {
            return self.newest;
        }
        let end = self.taken.saturating_sub(self.carried).min(self.len);
        let before_newest = u128::from(self.span_ns) * (self.len - end) as u128 / self.len as u128;
        self.newest - Duration::from_nanos(before_newest as u64)
    }

    /// The arrival of the next frame, `frame_len` bytes long, as admission takes it, and the
    /// instant its deadline counts from. `paced_now` gives the instant now if the connection
    /// is paced (its reader holds it back as a window, `sluice_overload::backlog`).
    ///
    /// A paced connection's frames are the backlog its client holds, held back on purpose:
    /// each arrives when the reader takes it, the earliest the shard could have started it,
    /// as if it had waited in the kernel until then. Counted from its read (or its kernel
    /// stamp) instead, a window larger than what the shard serves within a deadline, read at
    /// once (ahead, [`Self::read_ahead`], or in one large read), would see its last requests
    /// expire. A connection that is not paced (it keeps pushing) counts from the kernel's
    /// stamps, and its frames read ahead from the read-ahead, spread back towards the
    /// arrival of the bytes before them, like a read's.
    #[inline]
    pub fn next_arrival(
        &mut self,
        frame_len: usize,
        paced_now: impl FnOnce() -> Option<Instant>,
    ) -> Arrival<Instant> {
        let end = self.taken.saturating_add(frame_len);
        if let Some(now) = paced_now() {
            self.taken = end;
            return Arrival::Read(now);
        }
        if end > self.ahead.from {
            self.taken = end;
            return Arrival::Received(self.ahead.arrival(end - self.ahead.from));
        }
        let at = self.next_frame(frame_len);
        if self.received {
            Arrival::Received(at)
        } else {
            Arrival::Read(at)
        }
    }
}

/// What the reader remembers of its last socket read, to bound when the next read's bytes
/// can have arrived (see [`ReadArrivals`]).
#[derive(Clone, Copy, Debug)]
pub struct LastRead {
    /// When it completed.
    done: Instant,
    /// When its newest byte arrived.
    newest: Instant,
    /// It filled the room it had: the socket still held more (else it emptied the socket).
    filled: bool,
}

impl LastRead {
    /// No read yet: the connection was made at `at`.
    pub fn connected(at: Instant) -> Self {
        LastRead {
            done: at,
            newest: at,
            filled: false,
        }
    }

    /// The arrivals of the frames of read `r`, which completed at `now` with `spare` bytes of
    /// room after `carried` bytes already buffered, on a loop whose tasks wait `loop_lag` to
    /// run once ready; remembers it for the next. Nothing counts from before `resumed_at`,
    /// the end of the reader's last pause.
    pub fn next(
        &mut self,
        r: &Read,
        spare: usize,
        carried: usize,
        now: Instant,
        resumed_at: Instant,
        loop_lag: Duration,
    ) -> ReadArrivals {
        let filled = r.len >= spare;
        if !r.stamped {
            *self = LastRead {
                done: now,
                newest: now,
                filled,
            };
            return ReadArrivals::all_at(now);
        }
        let newest = now
            .checked_sub(r.newest_waited)
            .unwrap_or(now)
            .max(resumed_at);
        // The earliest the first byte can have come: after the last read's newest byte, and
        // after the last read itself if it emptied the socket; no earlier than the last
        // pause. A reader that waited for its bytes was woken by the first of them and then
        // waited about the loop's lag to run: what came before the wake-up waited for no
        // one, what came after it waited for the loop.
        let earliest = if r.idle_before {
            now.checked_sub(loop_lag)
                .unwrap_or(now)
                .max(self.done)
                .max(resumed_at)
                .min(newest)
        } else if self.filled {
            self.newest.max(resumed_at).min(newest)
        } else {
            self.done.max(resumed_at).min(newest)
        };
        *self = LastRead {
            done: now,
            newest,
            filled,
        };
        ReadArrivals::spread(newest, newest - earliest, carried, r.len)
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
        let r = read_stamped(&rd, &mut buf).await.expect("read");
        assert_eq!(r.len, 4, "read the bytes, not an end of stream");
        assert!(buf.ends_with(b"more"));
    }

    #[tokio::test]
    async fn bytes_left_unread_report_how_long_they_waited() {
        let (mut client, server) = connected();
        enable(server.as_raw_fd()).expect("SO_TIMESTAMPNS");
        // The kernel turns its receive stamps on in deferred work when no socket had them.
        std::thread::sleep(Duration::from_millis(20));
        let (rd, _wr) = tokio::net::TcpStream::from_std(server)
            .expect("tokio stream")
            .into_split();
        // A new socket is not known to be readable yet: its first read waits for the event.
        client.write_all(b"zero").expect("write");
        let mut buf = BytesMut::with_capacity(64);
        let r = read_stamped(&rd, &mut buf).await.expect("read");
        assert_eq!(&buf[..], b"zero");
        buf.clear();
        client.write_all(b"first").expect("write");
        std::thread::sleep(Duration::from_millis(60));
        let r2 = read_stamped(&rd, &mut buf).await.expect("read");
        assert!(r.idle_before, "{r:?}");
        let r = r2;
        assert_eq!(&buf[..r.len], b"first");
        assert!(r.newest_waited >= Duration::from_millis(50), "{r:?}");
        assert!(
            !r.idle_before,
            "the bytes were there before the read: {r:?}"
        );
        // Read while it waits: no wait to speak of, and the reader was idle before them.
        let reading = tokio::spawn(async move {
            let r = read_stamped(&rd, &mut buf).await.expect("read");
            (r, buf)
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        client.write_all(b"second").expect("write");
        let (r, buf) = reading.await.expect("reader");
        assert_eq!(&buf[5..5 + r.len], b"second");
        assert!(r.newest_waited < Duration::from_millis(50), "{r:?}");
        assert!(r.idle_before, "the reader waited for these bytes: {r:?}");
    }

    /// A read's frames are spread between its earliest possible arrival and its newest
    /// byte's stamp, by where each ends; bytes carried from the read before count as this
    /// read's first.
    #[test]
    fn frames_of_a_read_arrive_in_proportion_to_where_they_end() {
        let newest = Instant::now();
        let ms = Duration::from_millis;
        // 10 bytes carried, then a read of 1,000 spread over 100 ms.
        let mut arrivals = ReadArrivals::spread(newest, ms(100), 10, 1_000);
        // A frame completed by the read's 250th byte, then one by its 750th, then its last.
        assert_eq!(arrivals.next_frame(260), newest - ms(75));
        assert_eq!(arrivals.next_frame(500), newest - ms(25));
        assert_eq!(arrivals.next_frame(250), newest);
        // Without a span every frame arrived with the newest byte.
        let mut flat = ReadArrivals::spread(newest, Duration::ZERO, 0, 1_000);
        assert_eq!(flat.next_frame(100), newest);
        let mut at_once = ReadArrivals::all_at(newest);
        assert_eq!(at_once.next_frame(100), newest);
        assert_eq!(at_once.next_frame(100), newest);
    }

    /// A read that found the socket empty and waited: its bytes that came before the reader
    /// was woken waited for no one, those after it waited the loop's lag at most, so its
    /// frames spread back over that lag, never before the last read nor past the stamp.
    #[test]
    fn frames_after_a_wait_spread_over_the_loop_lag() {
        let ms = Duration::from_millis;
        let start = Instant::now();
        let now = start + ms(100);
        let idle_read = |newest_waited| Read {
            len: 1_000,
            newest_waited,
            idle_before: true,
            stamped: true,
        };
        // Woken by its first bytes 8 ms ago; the newest came 1 ms ago.
        let mut last = LastRead::connected(start);
        let mut a = last.next(&idle_read(ms(1)), 4_096, 0, now, start, ms(8));
        assert_eq!(a.next_frame(500), now - ms(1) - ms(7) / 2);
        assert_eq!(a.next_frame(500), now - ms(1));
        // An idle loop: no lag, every frame arrived with the newest byte.
        let mut last = LastRead::connected(start);
        let mut a = last.next(&idle_read(ms(1)), 4_096, 0, now, start, Duration::ZERO);
        assert_eq!(a.next_frame(500), now - ms(1));
        // A lag longer than the wait since the last read: from the last read, no earlier.
        let mut last = LastRead::connected(now - ms(3));
        let mut a = last.next(&idle_read(ms(1)), 4_096, 0, now, start, ms(50));
        assert_eq!(a.next_frame(500), now - ms(2));
        // The newest byte came before the reader could have been woken: no spread.
        let mut last = LastRead::connected(start);
        let mut a = last.next(&idle_read(ms(20)), 4_096, 0, now, start, ms(8));
        assert_eq!(a.next_frame(500), now - ms(20));
    }

    /// A paced connection's frames arrive when the reader takes them; a pushing connection's
    /// frames read ahead behind a read are spread between the byte before them and the
    /// read-ahead, the frames of the read itself keep their stamps, and a pause keeps what
    /// was read ahead.
    #[test]
    fn frames_read_ahead_arrive_when_a_paced_reader_takes_them() {
        let ms = Duration::from_millis;
        let newest = Instant::now();
        let ahead_at = newest + ms(40);
        let taken_at = newest + ms(3_000);
        let paced = || Some(taken_at);
        let pushing = || None;
        // A read of 1,000 bytes spread over 100 ms; 100 bytes of it taken, then 2,000 bytes
        // read ahead behind the other 900.
        let mut a = ReadArrivals::spread(newest, ms(100), 0, 1_000);
        assert_eq!(
            a.next_arrival(100, pushing),
            Arrival::Received(newest - ms(90))
        );
        a.read_ahead(900, 2_000, ahead_at);
        // The rest of the read: its own stamps, or when taken if paced.
        let mut read = a;
        assert_eq!(read.next_arrival(400, paced), Arrival::Read(taken_at));
        assert_eq!(
            a.next_arrival(400, pushing),
            Arrival::Received(newest - ms(50))
        );
        assert_eq!(a.next_arrival(500, pushing), Arrival::Received(newest));
        // Read ahead: paced, when taken; pushing, spread over the 40 ms before the read-ahead.
        let mut b = a;
        assert_eq!(a.next_arrival(1_000, paced), Arrival::Read(taken_at));
        assert_eq!(a.next_arrival(1_000, paced), Arrival::Read(taken_at));
        assert_eq!(
            b.next_arrival(1_000, pushing),
            Arrival::Received(newest + ms(20))
        );
        assert_eq!(b.next_arrival(1_000, pushing), Arrival::Received(ahead_at));
        // A frame that ends in the bytes read ahead was completed by them.
        let mut c = ReadArrivals::spread(newest, ms(100), 0, 1_000);
        c.read_ahead(1_000, 500, ahead_at);
        assert_eq!(c.next_arrival(1_200, paced), Arrival::Read(taken_at));
        // A second read-ahead extends the first; a pause keeps both read ahead.
        let mut d = ReadArrivals::spread(newest, ms(100), 0, 1_000);
        d.read_ahead(1_000, 500, ahead_at);
        d.read_ahead(1_500, 500, ahead_at + ms(40));
        assert_eq!(d.next_arrival(1_000, pushing), Arrival::Received(newest));
        let resumed_at = newest + ms(60);
        let mut d = d.resumed(resumed_at);
        assert_eq!(
            d.next_arrival(500, pushing),
            Arrival::Received(ahead_at + ms(30))
        );
        assert_eq!(
            d.next_arrival(500, pushing),
            Arrival::Received(ahead_at + ms(40))
        );
        // A pause in the middle of what was read ahead, then more read ahead behind it.
        let mut f = ReadArrivals::spread(newest, ms(100), 0, 1_000);
        f.read_ahead(1_000, 1_000, ahead_at);
        f.next_arrival(1_000, pushing);
        assert_eq!(
            f.next_arrival(500, pushing),
            Arrival::Received(newest + ms(20))
        );
        let mut f = f.resumed(newest + ms(10));
        f.read_ahead(500, 500, ahead_at + ms(40));
        assert_eq!(
            f.next_arrival(500, pushing),
            Arrival::Received(newest + ms(50))
        );
        assert_eq!(f.next_arrival(500, paced), Arrival::Read(taken_at));
        // Without a read-ahead a pause counts everything buffered from its end.
        let mut e = ReadArrivals::spread(newest, ms(100), 0, 1_000).resumed(resumed_at);
        assert_eq!(e.next_arrival(1_000, pushing), Arrival::Read(resumed_at));
    }
}
