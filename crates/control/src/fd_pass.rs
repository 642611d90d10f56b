//! Passing an open file with a request (`SCM_RIGHTS`).

use crate::Request;
use rustix::net::{
    recvmsg, sendmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use std::io::{IoSlice, IoSliceMut, Write};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;

/// The most descriptors kept from one exchange (a `reimport` request or a `reexport` reply
/// passes one per handle; more are closed).
pub const MAX_FDS: usize = 4096;

/// The most descriptors one message carries (the kernel's `SCM_MAX_FD` is 253).
const PER_MESSAGE: usize = 250;

/// Sends `line` on `stream` with `fds` attached (up to 250 to each of its first
/// bytes, in order), then the rest of the line.
pub fn send_line_with_fds(
    mut stream: &UnixStream,
    line: &[u8],
    fds: &[std::os::fd::BorrowedFd<'_>],
) -> std::io::Result<()> {
    let chunks: Vec<&[std::os::fd::BorrowedFd<'_>]> = fds.chunks(PER_MESSAGE).collect();
    if chunks.len() > line.len() {
        return Err(std::io::Error::other(format!(
            "{} descriptors need a line of at least {} bytes",
            fds.len(),
            chunks.len()
        )));
    }
    let mut at = 0;
    for chunk in chunks {
        let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(PER_MESSAGE))];
        let mut cmsg = SendAncillaryBuffer::new(&mut space);
        if !cmsg.push(SendAncillaryMessage::ScmRights(chunk)) {
            return Err(std::io::Error::other(
                "no room for the descriptors in the message",
            ));
        }
        loop {
            match sendmsg(
                stream,
                &[IoSlice::new(&line[at..at + 1])],
                &mut cmsg,
                SendFlags::NOSIGNAL,
            ) {
                Ok(_) => break,
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        at += 1;
    }
    stream.write_all(&line[at..])
}

/// Reads one line from `stream` with the descriptors that come with it (at most
/// [`MAX_FDS`]); `limit`: the longest line taken.
pub fn recv_line_with_fds(
    stream: &UnixStream,
    limit: usize,
) -> std::io::Result<(String, Vec<OwnedFd>)> {
    let mut line = Vec::new();
    let mut fds = Vec::new();
    let mut byte = [0u8; 1];
    // A byte at a time: nothing after the line's end is taken from the socket.
    loop {
        let n = recv_with_fds(stream, &mut byte, &mut fds)?;
        if n == 0 || byte[0] == b'\n' {
            break;
        }
        line.push(byte[0]);
        if line.len() > limit {
            return Err(std::io::Error::other(format!(
                "a line longer than {limit} bytes"
            )));
        }
    }
    String::from_utf8(line)
        .map(|s| (s, fds))
        .map_err(|_| std::io::Error::other("a line that is not UTF-8"))
}

/// Sends `req` on `stream`, with `file`'s descriptor attached to its first byte when
/// given (the request should then say `"fd":true`).
pub fn send_request(
    mut stream: &UnixStream,
    req: &Request,
    file: Option<std::os::fd::BorrowedFd<'_>>,
) -> std::io::Result<()> {
    let line = req.to_line();
    let bytes = line.as_bytes();
    let Some(fd) = file else {
        return stream.write_all(bytes);
    };
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut cmsg = SendAncillaryBuffer::new(&mut space);
    let fds = [fd];
    if !cmsg.push(SendAncillaryMessage::ScmRights(&fds)) {
        return Err(std::io::Error::other(
            "no room for the descriptor in the message",
        ));
    }
    // The first byte carries the descriptor; the rest follows as ordinary writes.
    let sent = loop {
        match sendmsg(
            stream,
            &[IoSlice::new(&bytes[..1])],
            &mut cmsg,
            SendFlags::NOSIGNAL,
        ) {
            Ok(n) => break n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    };
    stream.write_all(&bytes[sent..])
}

/// Reads what is there (at most `buf.len()` bytes) from `stream`, keeping descriptors
/// passed with it in `fds` (at most [`MAX_FDS`] in all; the kernel closes those that do
/// not fit, the rest beyond are dropped here). Received descriptors are close-on-exec.
/// Returns the bytes read (0 at the end); `WouldBlock` on a non-blocking socket with
/// nothing to read.
pub fn recv_with_fds(
    stream: &UnixStream,
    buf: &mut [u8],
    fds: &mut Vec<OwnedFd>,
) -> std::io::Result<usize> {
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(PER_MESSAGE))];
    let mut cmsg = RecvAncillaryBuffer::new(&mut space);
    let r = loop {
        match recvmsg(
            stream.as_fd(),
            &mut [IoSliceMut::new(buf)],
            &mut cmsg,
            RecvFlags::CMSG_CLOEXEC,
        ) {
            Ok(r) => break r,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    };
    for msg in cmsg.drain() {
        if let RecvAncillaryMessage::ScmRights(received) = msg {
            for fd in received {
                if fds.len() < MAX_FDS {
                    fds.push(fd);
                }
            }
        }
    }
    // The kernel dropped descriptors that did not fit (this process's RLIMIT_NOFILE):
    // a short list would be read as a complete one.
    if r.flags.contains(rustix::net::ReturnFlags::CTRUNC) {
        return Err(std::io::Error::other(
            "descriptors passed with the message were dropped (the open-file limit, RLIMIT_NOFILE, is too low for them)",
        ));
    }
    Ok(r.bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek};

    #[test]
    fn a_file_travels_with_the_request() {
        let (a, b) = UnixStream::pair().unwrap();
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(b"image bytes").unwrap();
        let req = Request::Restore {
            path: "/x.img".into(),
            force: false,
            fd: true,
            progress: false,
        };
        send_request(&a, &req, Some(f.as_fd())).unwrap();
        drop(a);
        let mut got = Vec::new();
        let mut fds = Vec::new();
        let mut buf = [0u8; 7];
        loop {
            let n = recv_with_fds(&b, &mut buf, &mut fds).unwrap();
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        assert_eq!(Request::parse(std::str::from_utf8(&got).unwrap()), Ok(req));
        assert_eq!(fds.len(), 1);
        let mut passed = std::fs::File::from(fds.pop().unwrap());
        passed.seek(std::io::SeekFrom::Start(0)).unwrap();
        let mut s = String::new();
        passed.read_to_string(&mut s).unwrap();
        assert_eq!(s, "image bytes");
    }

    #[test]
    fn a_request_without_a_file_reads_as_before() {
        let (a, b) = UnixStream::pair().unwrap();
        send_request(&a, &Request::Status {}, None).unwrap();
        let mut buf = [0u8; 64];
        let mut fds = Vec::new();
        let n = recv_with_fds(&b, &mut buf, &mut fds).unwrap();
        assert_eq!(&buf[..n], b"{\"cmd\":\"status\"}\n");
        assert!(fds.is_empty());
    }
}
