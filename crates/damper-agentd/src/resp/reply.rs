//! A reply, said in the protocol the connection speaks: RESP2 until the
//! client says `HELLO 3`, RESP3 after. Encoded by the `redis-protocol`
//! crate; this file only chooses the frame each value becomes.

use bytes::{Bytes, BytesMut};
use redis_protocol::resp2::types::BytesFrame as Frame2;
use redis_protocol::resp3::types::{BytesFrame as Frame3, FrameMap};

/// The protocol a connection speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// RESP2, every connection's start.
    Resp2,
    /// RESP3, after `HELLO 3`.
    Resp3,
}

/// A reply, before it is encoded.
#[derive(Clone, Debug, PartialEq)]
pub enum Reply {
    /// `+OK`.
    Ok,
    /// A simple string (`+PONG`).
    Simple(&'static str),
    /// An error line; the text starts with its code (`ERR …`).
    Error(String),
    /// An integer.
    Int(i64),
    /// A bulk (RESP2) or blob (RESP3) string.
    Bulk(Bytes),
    /// A double: RESP3's own type, a bulk string in RESP2 (as Redis does
    /// for scores).
    Double(f64),
    /// A null.
    Null,
    /// An array.
    Array(Vec<Reply>),
    /// A map: RESP3's own type, a flat array of keys and values in RESP2.
    Map(Vec<(Reply, Reply)>),
}

impl Reply {
    /// A bulk string of `text`.
    pub fn text(text: impl Into<String>) -> Reply {
        Reply::Bulk(Bytes::from(text.into()))
    }

    /// An `ERR` error line.
    pub fn err(text: impl std::fmt::Display) -> Reply {
        Reply::Error(format!("ERR {text}"))
    }

    /// Appends the reply to `out` in `protocol`.
    pub fn encode(self, protocol: Protocol, out: &mut BytesMut) {
        // Encoding a frame we built into a growable buffer cannot fail.
        let _ = match protocol {
            Protocol::Resp2 => {
                redis_protocol::resp2::encode::extend_encode(out, &self.resp2(), false)
            }
            Protocol::Resp3 => {
                redis_protocol::resp3::encode::complete::extend_encode(out, &self.resp3(), false)
            }
        };
    }

    fn resp2(self) -> Frame2 {
        match self {
            Reply::Ok => Frame2::SimpleString(Bytes::from_static(b"OK")),
            Reply::Simple(s) => Frame2::SimpleString(Bytes::from_static(s.as_bytes())),
            Reply::Error(e) => Frame2::Error(one_line(e).into()),
            Reply::Int(i) => Frame2::Integer(i),
            Reply::Bulk(b) => Frame2::BulkString(b),
            Reply::Double(d) => Frame2::BulkString(Bytes::from(format_double(d))),
            Reply::Null => Frame2::Null,
            Reply::Array(items) => Frame2::Array(items.into_iter().map(Reply::resp2).collect()),
            Reply::Map(pairs) => Frame2::Array(
                pairs
                    .into_iter()
                    .flat_map(|(k, v)| [k.resp2(), v.resp2()])
                    .collect(),
            ),
        }
    }

    fn resp3(self) -> Frame3 {
        match self {
            Reply::Ok => Frame3::SimpleString {
                data: Bytes::from_static(b"OK"),
                attributes: None,
            },
            Reply::Simple(s) => Frame3::SimpleString {
                data: Bytes::from_static(s.as_bytes()),
                attributes: None,
            },
            Reply::Error(e) => Frame3::SimpleError {
                data: one_line(e).into(),
                attributes: None,
            },
            Reply::Int(data) => Frame3::Number {
                data,
                attributes: None,
            },
            Reply::Bulk(data) => Frame3::BlobString {
                data,
                attributes: None,
            },
            Reply::Double(data) => Frame3::Double {
                data,
                attributes: None,
            },
            Reply::Null => Frame3::Null,
            Reply::Array(items) => Frame3::Array {
                data: items.into_iter().map(Reply::resp3).collect(),
                attributes: None,
            },
            Reply::Map(pairs) => {
                let mut data = FrameMap::with_capacity(pairs.len());
                for (k, v) in pairs {
                    data.insert(k.resp3(), v.resp3());
                }
                Frame3::Map {
                    data,
                    attributes: None,
                }
            }
        }
    }
}

/// An error line may not break lines.
fn one_line(text: String) -> String {
    if text.contains(['\r', '\n']) {
        text.replace(['\r', '\n'], " ")
    } else {
        text
    }
}

/// A double as Redis prints one: shortest round-trip form, `inf`/`-inf`.
fn format_double(d: f64) -> String {
    if d.is_infinite() {
        if d > 0.0 { "inf".into() } else { "-inf".into() }
    } else {
        d.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn said(reply: Reply, protocol: Protocol) -> String {
        let mut out = BytesMut::new();
        reply.encode(protocol, &mut out);
        String::from_utf8(out.to_vec()).unwrap()
    }

    #[test]
    fn a_check_reply_in_both_protocols() {
        let reply = || {
            Reply::Array(vec![
                Reply::Int(0),
                Reply::Double(0.9),
                Reply::Int(2000),
                Reply::Double(1000.0),
            ])
        };
        assert_eq!(
            said(reply(), Protocol::Resp2),
            "*4\r\n:0\r\n$3\r\n0.9\r\n:2000\r\n$4\r\n1000\r\n"
        );
        assert_eq!(
            said(reply(), Protocol::Resp3),
            "*4\r\n:0\r\n,0.9\r\n:2000\r\n,1000\r\n"
        );
    }

    #[test]
    fn errors_stay_on_one_line_and_maps_flatten_in_resp2() {
        assert_eq!(
            said(Reply::err("bad\r\nthing"), Protocol::Resp2),
            "-ERR bad  thing\r\n"
        );
        let map = Reply::Map(vec![(Reply::text("proto"), Reply::Int(2))]);
        assert_eq!(
            said(map.clone(), Protocol::Resp2),
            "*2\r\n$5\r\nproto\r\n:2\r\n"
        );
        assert_eq!(said(map, Protocol::Resp3), "%1\r\n$5\r\nproto\r\n:2\r\n");
    }
}
