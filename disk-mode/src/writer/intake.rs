//! A data stream's side of the receiver: frames read off its socket, their
//! work handed to the writer of their file.

use super::*;

/// Where a data stream's [`Intake`] is in the frame it reads.
pub(super) enum Reading {
    Header {
        buf: [u8; FRAME_HEADER_LEN],
        got: usize,
    },
    /// A data frame's payload, into a pool buffer (`None` until the pool
    /// has one), hashed piece by piece as it arrives.
    Data {
        h: FrameHeader,
        buf: Option<AlignedBuf>,
        got: usize,
    },
    Fail {
        h: FrameHeader,
        msg: Vec<u8>,
        got: usize,
    },
    /// Parsed work for a writer whose queue was full.
    Handing { work: Work, worker: usize },
}

/// One data stream's side of the receiver pipeline: reads frames off a
/// non-blocking socket and hands their work to the file's writer.
pub(crate) struct Intake {
    pub(super) pipeline: Arc<ReceivePipeline>,
    pub(super) state: Reading,
    pub(super) hasher: Xxh3,
}

impl Intake {
    pub(crate) fn new(pipeline: Arc<ReceivePipeline>) -> Intake {
        Intake {
            pipeline,
            state: Reading::Header {
                buf: [0; FRAME_HEADER_LEN],
                got: 0,
            },
            hasher: Xxh3::new(),
        }
    }

    /// One turn; `Done` at the stream's `EndOfStream`. A protocol violation
    /// is an `InvalidData` error.
    pub(crate) fn receive(&mut self, io: &StreamIo<'_>) -> io::Result<Progress> {
        let mut moved = 0;
        loop {
            match &mut self.state {
                Reading::Handing { .. } => {
                    let Reading::Handing { work, worker } = std::mem::replace(
                        &mut self.state,
                        Reading::Header {
                            buf: [0; FRAME_HEADER_LEN],
                            got: 0,
                        },
                    ) else {
                        unreachable!("matched above")
                    };
                    match self.pipeline.queues[worker].push(work, io.waker) {
                        Push::Queued => {}
                        Push::Full(work) => {
                            self.state = Reading::Handing { work, worker };
                            return Ok(Progress::woken());
                        }
                        Push::Closed => return Err(io::Error::other("receiver shutting down")),
                    }
                }
                Reading::Header { buf, got } => {
                    if *got == 0 && moved >= io.allowance {
                        return Ok(Progress::Yield);
                    }
                    match read_some(io.sock, &mut buf[*got..])? {
                        None => return Ok(Progress::readable()),
                        Some(0) if *got == 0 => {
                            return Err(io::Error::new(
                                io::ErrorKind::UnexpectedEof,
                                "data stream closed before its end marker",
                            ))
                        }
                        Some(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                        Some(n) => *got += n,
                    }
                    if *got < FRAME_HEADER_LEN {
                        continue;
                    }
                    let h = FrameHeader::decode(buf)?;
                    match self.after_header(h)? {
                        Some(next) => self.state = next,
                        None => return Ok(Progress::Done),
                    }
                }
                Reading::Data { h, buf, got } => {
                    if buf.is_none() {
                        match self.pipeline.shared.pool.take(io.waker) {
                            Take::Buf(b) => *buf = Some(b),
                            Take::Later => return Ok(Progress::woken()),
                            Take::Closed => return Err(io::Error::other("receiver shutting down")),
                        }
                    }
                    let b = buf.as_mut().expect("taken above");
                    let len = h.len as usize;
                    let n = match read_some(io.sock, &mut b.as_mut_full()[*got..len])? {
                        None => return Ok(Progress::readable()),
                        Some(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                        Some(n) => n,
                    };
                    // Hash what just arrived while it is in the cache.
                    self.hasher.update(&b.head(*got + n)[*got..]);
                    *got += n;
                    moved += n;
                    io.moved(n as u64);
                    if *got < len {
                        continue;
                    }
                    let mut b = buf.take().expect("taken above");
                    b.set_len(len);
                    let hash = self.hasher.digest();
                    self.hasher.reset();
                    let h = *h;
                    let work = Work::Data {
                        file: h.file,
                        offset: h.offset,
                        buf: b,
                        hash,
                    };
                    self.state = self.hand(&h, work)?;
                }
                Reading::Fail { h, msg, got } => {
                    if *got < msg.len() {
                        match read_some(io.sock, &mut msg[*got..])? {
                            None => return Ok(Progress::readable()),
                            Some(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                            Some(n) => *got += n,
                        }
                        continue;
                    }
                    let h = *h;
                    let work = Work::Fail {
                        file: h.file,
                        message: String::from_utf8_lossy(msg).into_owned(),
                    };
                    self.state = self.hand(&h, work)?;
                }
            }
        }
    }

    /// What a frame's header leads to: reading its payload, or handing its
    /// work on; `None` at the stream's end marker.
    pub(super) fn after_header(&self, h: FrameHeader) -> io::Result<Option<Reading>> {
        Ok(Some(match h.kind {
            FrameKind::EndOfStream => return Ok(None),
            FrameKind::KeepAlive => Reading::Header {
                buf: [0; FRAME_HEADER_LEN],
                got: 0,
            },
            FrameKind::Data => {
                self.pipeline.check(&h)?;
                Reading::Data {
                    h,
                    buf: None,
                    got: 0,
                }
            }
            FrameKind::Fail => {
                self.pipeline.check(&h)?;
                Reading::Fail {
                    h,
                    msg: vec![0; h.len as usize],
                    got: 0,
                }
            }
            FrameKind::Hole => self.hand(
                &h,
                Work::Hole {
                    file: h.file,
                    offset: h.offset,
                    len: h.value,
                },
            )?,
            FrameKind::End => self.hand(
                &h,
                Work::End {
                    file: h.file,
                    checksum: h.value,
                },
            )?,
        }))
    }

    /// The state that hands `work` to the writer of `h`'s file.
    pub(super) fn hand(&self, h: &FrameHeader, work: Work) -> io::Result<Reading> {
        let x = self.pipeline.check(h)?;
        Ok(Reading::Handing {
            work,
            worker: x.worker,
        })
    }
}

impl Drop for Intake {
    fn drop(&mut self) {
        let buf = match std::mem::replace(
            &mut self.state,
            Reading::Header {
                buf: [0; FRAME_HEADER_LEN],
                got: 0,
            },
        ) {
            Reading::Data { buf, .. } => buf,
            Reading::Handing {
                work: Work::Data { buf, .. },
                ..
            } => Some(buf),
            _ => None,
        };
        if let Some(b) = buf {
            self.pipeline.shared.pool.put(b);
        }
    }
}

/// One non-blocking read: `None` when nothing is there yet.
pub(super) fn read_some(sock: &std::net::TcpStream, buf: &mut [u8]) -> io::Result<Option<usize>> {
    loop {
        match std::io::Read::read(&mut &*sock, buf) {
            Ok(n) => return Ok(Some(n)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}
