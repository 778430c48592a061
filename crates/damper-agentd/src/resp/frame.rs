//! Cutting commands out of a connection's bytes: a RESP array of bulk
//! strings (what every client library sends), or an inline command line
//! (what a person types into `telnet`), each at most `max` bytes.
//!
//! The `redis-protocol` crate decodes the array. Before it does, a scan of
//! the headers alone checks the command's shape: `*N`, then N bulk strings
//! and nothing nested, as Redis itself requires of a command. That bounds
//! the decoder's recursion (a frame of `*1\r\n*1\r\n…` nested thousands
//! deep would otherwise take the stack), and refuses an over-long command
//! from its header, before its bytes are buffered.

use std::ops::Range;

use redis_protocol::resp2::decode::decode_range;
use redis_protocol::resp2::types::RangeFrame;

/// Why a connection's bytes are not a command. The connection is answered
/// with `-ERR Protocol error: …` and closed, as Redis does: after a
/// malformed frame, where the next one starts is unknown.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Protocol error: {0}")]
pub struct ProtocolError(pub String);

fn error(text: impl Into<String>) -> ProtocolError {
    ProtocolError(text.into())
}

/// A command's arguments, as ranges into the buffer it was cut from.
pub type Args = Vec<Range<usize>>;

/// The next command at the start of `buf`, and how many bytes it takes;
/// `None` until it is whole. An empty command (a blank line, `*0`) has no
/// arguments and is skipped by the caller.
pub fn next_command(buf: &[u8], max: usize) -> Result<Option<(Args, usize)>, ProtocolError> {
    match buf.first() {
        None => Ok(None),
        Some(b'*') => multibulk(buf, max),
        Some(_) => Ok(inline(buf, max)?),
    }
}

fn multibulk(buf: &[u8], max: usize) -> Result<Option<(Args, usize)>, ProtocolError> {
    let Some(len) = multibulk_len(buf, max)? else {
        return Ok(None);
    };
    let frame = decode_range(&buf[..len]).map_err(|e| error(e.to_string()))?;
    match frame {
        Some((RangeFrame::Array(items), used)) if used == len => {
            let args = items
                .into_iter()
                .map(|item| match item {
                    RangeFrame::BulkString((start, end)) => Ok(start..end),
                    _ => Err(error("expected '$'")),
                })
                .collect::<Result<Args, _>>()?;
            Ok(Some((args, len)))
        }
        _ => Err(error("malformed multibulk command")),
    }
}

/// The length of the whole multibulk command at the start of `buf`, if
/// all of it is there: `*N\r\n` and N × `$L\r\n<L bytes>\r\n`.
fn multibulk_len(buf: &[u8], max: usize) -> Result<Option<usize>, ProtocolError> {
    let Some((n, mut at)) = header(buf, 0, b'*', max)? else {
        return Ok(None);
    };
    for _ in 0..n {
        if at >= buf.len() {
            return Ok(None);
        }
        let Some((len, body)) = header(buf, at, b'$', max)? else {
            return Ok(None);
        };
        at = body + len + 2;
        if at > max {
            return Err(error(format!("command over {max} bytes")));
        }
        if at > buf.len() {
            return Ok(None);
        }
        // Redis does not check the terminator; a wrong one means the
        // client and this server no longer agree where frames start.
        if &buf[at - 2..at] != b"\r\n" {
            return Err(error("expected CRLF after a bulk string"));
        }
    }
    Ok(Some(at))
}

/// Reads the `kind` header at `at`: the number it carries and where what
/// follows it starts.
fn header(
    buf: &[u8],
    at: usize,
    kind: u8,
    max: usize,
) -> Result<Option<(usize, usize)>, ProtocolError> {
    let what = if kind == b'*' { "multibulk" } else { "bulk" };
    if buf[at] != kind {
        return Err(error(format!(
            "expected '{}', got '{}'",
            kind as char,
            buf[at].escape_ascii()
        )));
    }
    // At most 20 digits and a CR LF.
    let window = &buf[at + 1..buf.len().min(at + 24)];
    let Some(cr) = window.iter().position(|&b| b == b'\r') else {
        if window.len() >= 23 {
            return Err(error(format!("invalid {what} length")));
        }
        return Ok(None);
    };
    if cr + 1 >= window.len() {
        return Ok(None);
    }
    let digits = &window[..cr];
    if window[cr + 1] != b'\n' || digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return Err(error(format!("invalid {what} length")));
    }
    let n: usize = std::str::from_utf8(digits)
        .ok()
        .and_then(|d| d.parse().ok())
        .ok_or_else(|| error(format!("invalid {what} length")))?;
    if n > max {
        return Err(error(format!("invalid {what} length")));
    }
    Ok(Some((n, at + 1 + cr + 2)))
}

/// An inline command: one line, arguments split on spaces.
fn inline(buf: &[u8], max: usize) -> Result<Option<(Args, usize)>, ProtocolError> {
    let Some(lf) = buf.iter().take(max).position(|&b| b == b'\n') else {
        if buf.len() >= max {
            return Err(error("too big inline request"));
        }
        return Ok(None);
    };
    let mut args = Args::new();
    let mut start = None;
    for (i, &b) in buf[..lf].iter().enumerate() {
        let space = b == b' ' || b == b'\t' || b == b'\r';
        match (space, start) {
            (false, None) => start = Some(i),
            (true, Some(s)) => {
                args.push(s..i);
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        args.push(s..lf);
    }
    Ok(Some((args, lf + 1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(buf: &[u8], max: usize) -> Result<Option<(Vec<String>, usize)>, ProtocolError> {
        Ok(next_command(buf, max)?.map(|(args, used)| {
            let words = args
                .into_iter()
                .map(|r| String::from_utf8_lossy(&buf[r]).into_owned())
                .collect();
            (words, used)
        }))
    }

    #[test]
    fn multibulk_commands_are_cut_whole_and_pipelined() {
        let two =
            b"*3\r\n$12\r\nDAMPER.CHECK\r\n$4\r\nacme\r\n$8\r\nmessages\r\n*1\r\n$4\r\nPING\r\n";
        let (first, used) = words(two, 1024).unwrap().unwrap();
        assert_eq!(first, ["DAMPER.CHECK", "acme", "messages"]);
        let (second, rest) = words(&two[used..], 1024).unwrap().unwrap();
        assert_eq!((second, used + rest), (vec!["PING".to_owned()], two.len()));
        // Every prefix is incomplete, never an error.
        for cut in 0..used {
            assert_eq!(words(&two[..cut], 1024).unwrap(), None, "cut at {cut}");
        }
        // Binary-safe: a bulk string may hold CR LF.
        let (args, _) = words(b"*1\r\n$4\r\na\r\nb\r\n", 64).unwrap().unwrap();
        assert_eq!(args, ["a\r\nb"]);
    }

    #[test]
    fn inline_commands_split_on_spaces() {
        let (args, used) = words(b"DAMPER.CHECK  acme messages 5\r\nPING\r\n", 1024)
            .unwrap()
            .unwrap();
        assert_eq!(args, ["DAMPER.CHECK", "acme", "messages", "5"]);
        assert_eq!(used, 31);
        assert_eq!(words(b"\r\n", 64).unwrap().unwrap(), (vec![], 2));
        assert_eq!(words(b"PING", 64).unwrap(), None);
    }

    #[test]
    fn malformed_nested_and_oversized_frames_are_protocol_errors() {
        for (bytes, max, says) in [
            (
                &b"*1\r\n*1\r\n$4\r\nPING\r\n"[..],
                1024,
                "expected '$', got '*'",
            ),
            (b"*1\r\n:5\r\n", 1024, "expected '$', got ':'"),
            (b"*x\r\n", 1024, "invalid multibulk length"),
            (b"*-1\r\n", 1024, "invalid multibulk length"),
            (b"*1\r\n$99999\r\n", 1024, "invalid bulk length"),
            (b"*1\r\n$5\r\nhello", 8, "command over 8 bytes"),
            (b"*1\r\n$1\r\nab\r\n", 1024, "expected CRLF"),
            (
                b"*123456789012345678901234\r\n",
                1 << 40,
                "invalid multibulk length",
            ),
            (b"PING PING PING", 8, "too big inline request"),
        ] {
            let e = words(bytes, max).unwrap_err().to_string();
            assert!(
                e.contains(says),
                "{:?}: {e}",
                bytes.escape_ascii().to_string()
            );
        }
        // Deep nesting is refused at its second header, without recursion.
        let deep = b"*1\r\n".repeat(100_000);
        assert!(words(&deep, 1 << 20).is_err());
    }

    use proptest::prelude::*;

    /// A command as a client library encodes it.
    fn encode(args: &[Vec<u8>]) -> Vec<u8> {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            out.extend_from_slice(a);
            out.extend_from_slice(b"\r\n");
        }
        out
    }

    proptest! {
        /// Fuzzing on stable: any bytes are a command, an incomplete one,
        /// or a protocol error; never a panic, never more than was there.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..600), max in 16usize..1024) {
            if let Ok(Some((args, used))) = next_command(&bytes, max) {
                prop_assert!(used <= bytes.len());
                for r in args {
                    prop_assert!(r.end <= used);
                }
            }
        }

        /// Whatever a client encodes is cut back into the same arguments,
        /// whole only once every byte is there, and pipelined commands
        /// follow one another exactly.
        #[test]
        fn encoded_commands_round_trip_at_every_cut(
            first in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..40), 1..6),
            second in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..40), 1..6),
        ) {
            let (a, b) = (encode(&first), encode(&second));
            let both = [a.clone(), b.clone()].concat();
            for cut in 0..a.len() {
                prop_assert_eq!(next_command(&both[..cut], 4096).unwrap(), None);
            }
            let (args, used) = next_command(&both, 4096).unwrap().unwrap();
            prop_assert_eq!(used, a.len());
            let got: Vec<Vec<u8>> = args.into_iter().map(|r| both[r].to_vec()).collect();
            prop_assert_eq!(&got, &first);
            let (args, used2) = next_command(&both[used..], 4096).unwrap().unwrap();
            prop_assert_eq!(used2, b.len());
            let got: Vec<Vec<u8>> = args.into_iter().map(|r| both[used..][r].to_vec()).collect();
            prop_assert_eq!(&got, &second);
        }
    }
}
