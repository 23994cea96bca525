//! An attached step's bytes (`srun --jobid` from outside its job): the
//! tasks' output back to `srun` as it comes, and `srun`'s standard input
//! to every task, each chunk a line of JSON ([`StepInput`]) on the step's
//! connection, bounded; a node watches the connection for `srun`'s end
//! while a task that does not read holds its input back.

use std::io::{BufRead, Read, Write};
use std::net::TcpStream;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use serde::{Deserialize, Serialize};

use super::remote::send;

/// What `srun --jobid` sends a node after its request: its standard
/// input, for every task there, then its end.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepInput {
    /// Bytes, in base64.
    Data {
        data: String,
    },
    End,
}

/// The longest line of [`StepInput`] a node takes: a larger one ends the
/// step (its tasks killed), as a closed connection does.
const INPUT_LINE_BYTES: u64 = 1 << 20;

/// An attached step's output (base64) to `srun`'s own, as it comes.
pub fn write_data(data: &str, err: bool) {
    let Ok(bytes) = BASE64.decode(data.as_bytes()) else { return };
    let _ = match err {
        true => std::io::stderr().lock().write_all(&bytes),
        false => {
            let mut out = std::io::stdout().lock();
            out.write_all(&bytes).and_then(|()| out.flush())
        }
    };
}

/// `srun`'s standard input to an attached step's nodes (`streams`), as
/// it comes, then its end.
pub fn send_input(streams: Vec<TcpStream>) {
    let mut streams = streams;
    copy_bytes(std::io::stdin().lock(), |data| {
        let input = StepInput::Data { data: BASE64.encode(data) };
        streams.retain_mut(|s| send(s, &input).is_ok());
        Ok(())
    });
    for stream in &mut streams {
        let _ = send(stream, &StepInput::End);
    }
}

/// Passes `pipe`'s bytes to `send` as they come, until it ends or
/// `send` fails.
pub(super) fn copy_bytes(mut pipe: impl Read, mut send: impl FnMut(&[u8]) -> std::io::Result<()>) {
    let mut buffer = vec![0u8; 64 << 10];
    loop {
        match pipe.read(&mut buffer) {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if send(&buffer[..n]).is_err() {
                    return;
                }
            }
        }
    }
}

/// An attached step's standard input, from `srun`, chunk by chunk to
/// `each`, until its end, a line that is not [`StepInput`] or longer than
/// [`INPUT_LINE_BYTES`], or the connection's end.
fn input_chunks(reader: &mut impl BufRead, mut each: impl FnMut(Vec<u8>)) {
    let mut line = Vec::new();
    loop {
        line.clear();
        match reader.by_ref().take(INPUT_LINE_BYTES).read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) if !line.ends_with(b"\n") => return,
            Ok(_) => {}
        }
        match serde_json::from_slice::<StepInput>(&line) {
            Ok(StepInput::Data { data }) => match BASE64.decode(data.as_bytes()) {
                Ok(bytes) => each(bytes),
                Err(_) => return,
            },
            Ok(StepInput::End) | Err(_) => return,
        }
    }
}

/// Feeds an attached step's input to every task here (`inputs`); a task
/// that stopped reading no longer gets it. A task that does not read holds
/// it back (to `srun`, through TCP), so what waits is bounded.
pub(super) fn feed(reader: &mut impl BufRead, mut inputs: Vec<std::process::ChildStdin>) {
    input_chunks(reader, |data| {
        inputs.retain_mut(|input| input.write_all(&data).and_then(|()| input.flush()).is_ok());
    });
}

/// Waits until the other end of `stream` has gone (closed or reset)
/// without reading what it sent: while a task's unread input holds the
/// reader back, `srun`'s end is still seen.
pub(super) fn until_gone(stream: &TcpStream) {
    use nix::libc::{poll, pollfd, POLLERR, POLLHUP, POLLNVAL, POLLRDHUP};
    use std::os::fd::AsRawFd;
    let mut watched = pollfd { fd: stream.as_raw_fd(), events: POLLRDHUP, revents: 0 };
    loop {
        // SAFETY: one pollfd, ours, for the call's length.
        let ready = unsafe { poll(&mut watched, 1, -1) };
        let interrupted = std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted;
        if (ready < 0 && !interrupted) || watched.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL) != 0 {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input_lines(chunks: &[Vec<u8>], end: bool) -> Vec<u8> {
        let mut lines = Vec::new();
        for chunk in chunks {
            let data = BASE64.encode(chunk);
            lines.extend(serde_json::to_vec(&StepInput::Data { data }).unwrap());
            lines.push(b'\n');
        }
        if end {
            lines.extend(serde_json::to_vec(&StepInput::End).unwrap());
            lines.push(b'\n');
        }
        lines
    }

    proptest::proptest! {
        /// What srun sends comes out byte for byte, whatever the bytes and
        /// however they are cut.
        #[test]
        fn an_attached_steps_input_comes_out_as_sent(
            chunks in proptest::collection::vec(proptest::collection::vec(proptest::num::u8::ANY, 0..300), 0..8),
            end in proptest::bool::ANY,
        ) {
            let mut stream = std::io::Cursor::new(input_lines(&chunks, end));
            let mut got = Vec::new();
            input_chunks(&mut stream, |data| got.extend(data));
            proptest::prop_assert_eq!(got, chunks.concat());
        }

        /// Anything at all on the connection after the request: no panic,
        /// and the input stops at the first line that is not input.
        #[test]
        fn any_bytes_after_an_attached_request_end_its_input_without_panic(
            bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..2000),
        ) {
            input_chunks(&mut std::io::Cursor::new(bytes), |_| {});
        }
    }

    /// A line longer than the bound ends the input (and the step) rather
    /// than growing without end.
    #[test]
    fn an_endless_input_line_ends_the_input() {
        let mut endless = std::io::Cursor::new(vec![b'x'; (INPUT_LINE_BYTES + 10) as usize]);
        let mut chunks = 0;
        input_chunks(&mut endless, |_| chunks += 1);
        assert_eq!(chunks, 0);
        assert!(endless.position() <= INPUT_LINE_BYTES, "read {} bytes of one line", endless.position());
    }
}
