//! What a command's arguments ask for. Damper's own commands, and what
//! common Redis clients send on connecting, so they connect unmodified:
//!
//! | command | reply |
//! |---|---|
//! | `DAMPER.CHECK account op [cost [FROM publisher]]` | `[admitted 0\|1, factor, retry_after_ms, limit]` (kept at four: clients unpack it); `FROM` names who sent it, so publishers of one account each keep their share |
//! | `DAMPER.PEEK account op` | `[factor, limit, reason]`, counting nothing |
//! | `PING [message]`, `ECHO message` | as Redis |
//! | `HELLO [2\|3 [SETNAME name]]` | the server's description; switches RESP2/RESP3 |
//! | `CLIENT SETNAME\|GETNAME\|SETINFO\|ID` | as Redis |
//! | `COMMAND [COUNT\|DOCS\|INFO …]`, `INFO [section]` | this server's commands; the agent's stats |
//! | `SELECT 0`, `CONFIG GET …`, `QUIT`, `RESET` | what clients and `redis-benchmark` expect |
//!
//! Errors are Redis's own lines (`ERR wrong number of arguments for
//! 'damper.check' command`, `ERR unknown command …`), naming the field
//! for Damper's arguments (`ERR cost: not a non-negative integer`); the
//! connection stays open and nothing is counted.

use std::ops::Range;

/// A command, its arguments borrowed from the connection's buffer.
#[derive(Debug, PartialEq)]
pub enum Command<'a> {
    /// `DAMPER.CHECK`.
    Check {
        /// The account.
        account: &'a str,
        /// The op.
        op: &'a str,
        /// The cost (default 1).
        cost: u64,
        /// Who sent it (`FROM publisher`), when the client says.
        publisher: Option<&'a str>,
    },
    /// `DAMPER.PEEK`.
    Peek {
        /// The account.
        account: &'a str,
        /// The op.
        op: &'a str,
    },
    /// `PING [message]`.
    Ping(Option<&'a [u8]>),
    /// `ECHO message`.
    Echo(&'a [u8]),
    /// `HELLO [protover [SETNAME name]]`.
    Hello {
        /// 2 or 3, when given.
        version: Option<u8>,
        /// A connection name to set.
        setname: Option<&'a str>,
    },
    /// `CLIENT SETNAME name`.
    SetName(&'a str),
    /// `CLIENT GETNAME`.
    GetName,
    /// `CLIENT ID`.
    ClientId,
    /// `CLIENT SETINFO …`, `SELECT 0`: accepted, nothing to do.
    Accepted,
    /// `COMMAND` and its subcommands.
    Command(CommandQuery),
    /// `INFO [section]`.
    Info,
    /// `CONFIG GET parameter…`: nothing is configurable; `save` and
    /// `appendonly` are answered (nothing is persisted), as tools such as
    /// `redis-benchmark` ask for them.
    ConfigGet(Vec<String>),
    /// `QUIT`: `+OK`, then close.
    Quit,
    /// `RESET`: back to RESP2, no name.
    Reset,
}

/// What `COMMAND` asks.
#[derive(Debug, PartialEq, Eq)]
pub enum CommandQuery {
    /// Every command's description.
    All,
    /// How many commands there are.
    Count,
    /// Documentation (none is served: an empty answer).
    Docs,
    /// The descriptions of the named commands.
    Info(Vec<String>),
}

/// Every command served: name, arity (negative: at least that many),
/// flags, as `COMMAND` describes them.
pub const COMMANDS: &[(&str, i64, &[&str])] = &[
    ("damper.check", -3, &["write", "fast"]),
    ("damper.peek", 3, &["readonly", "fast"]),
    ("ping", -1, &["fast", "stale"]),
    ("echo", 2, &["fast"]),
    ("hello", -1, &["noscript", "loading", "stale", "fast"]),
    ("client", -2, &["noscript", "loading", "stale"]),
    ("command", -1, &["loading", "stale"]),
    ("info", -1, &["loading", "stale"]),
    ("select", 2, &["loading", "stale", "fast"]),
    ("config", -2, &["admin", "noscript", "loading", "stale"]),
    ("quit", -1, &["noscript", "loading", "stale", "fast"]),
    ("reset", 1, &["noscript", "loading", "stale", "fast"]),
];

/// Why a command is refused; the reply's text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct CommandError(pub String);

fn err(text: impl Into<String>) -> CommandError {
    CommandError(format!("ERR {}", text.into()))
}

fn arity(name: &str) -> CommandError {
    err(format!(
        "wrong number of arguments for '{}' command",
        name.to_ascii_lowercase()
    ))
}

fn utf8<'a>(field: &str, bytes: &'a [u8]) -> Result<&'a str, CommandError> {
    std::str::from_utf8(bytes).map_err(|_| err(format!("{field}: not valid UTF-8")))
}

/// A cost: a non-negative integer.
fn cost(bytes: &[u8]) -> Result<u64, CommandError> {
    std::str::from_utf8(bytes)
        .ok()
        .filter(|s| !s.starts_with('+'))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| err("cost: not a non-negative integer (or over 2^64 - 1)"))
}

impl<'a> Command<'a> {
    /// Reads the command in `args` (ranges into `buf`; at least one).
    pub fn parse(buf: &'a [u8], args: &[Range<usize>]) -> Result<Command<'a>, CommandError> {
        let arg = |i: usize| &buf[args[i].clone()];
        let name = String::from_utf8_lossy(arg(0));
        let n = args.len();
        let upper = name.to_ascii_uppercase();
        Ok(match upper.as_str() {
            "DAMPER.CHECK" => {
                if !matches!(n, 3 | 4 | 6) {
                    return Err(arity(&name));
                }
                if n == 6 && !arg(4).eq_ignore_ascii_case(b"FROM") {
                    return Err(err("syntax error: expected FROM publisher after the cost"));
                }
                Command::Check {
                    account: utf8("account", arg(1))?,
                    op: utf8("op", arg(2))?,
                    cost: if n >= 4 { cost(arg(3))? } else { 1 },
                    publisher: if n == 6 {
                        Some(utf8("publisher", arg(5))?)
                    } else {
                        None
                    },
                }
            }
            "DAMPER.PEEK" => {
                if n != 3 {
                    return Err(arity(&name));
                }
                Command::Peek {
                    account: utf8("account", arg(1))?,
                    op: utf8("op", arg(2))?,
                }
            }
            "PING" => match n {
                1 => Command::Ping(None),
                2 => Command::Ping(Some(arg(1))),
                _ => return Err(arity(&name)),
            },
            "ECHO" if n == 2 => Command::Echo(arg(1)),
            "HELLO" => hello(buf, args)?,
            "CLIENT" => client(buf, args)?,
            "COMMAND" => Command::Command(command(buf, args)),
            "INFO" => Command::Info,
            "SELECT" if n == 2 => {
                if arg(1) != b"0" {
                    return Err(err("DB index is out of range (damper-agentd has only 0)"));
                }
                Command::Accepted
            }
            "CONFIG" if n >= 3 && arg(1).eq_ignore_ascii_case(b"GET") => Command::ConfigGet(
                args[2..]
                    .iter()
                    .map(|r| String::from_utf8_lossy(&buf[r.clone()]).to_ascii_lowercase())
                    .collect(),
            ),
            "QUIT" => Command::Quit,
            "RESET" if n == 1 => Command::Reset,
            "ECHO" | "SELECT" | "RESET" | "CONFIG" => return Err(arity(&name)),
            _ => return Err(unknown(buf, args, &name)),
        })
    }
}

fn unknown(buf: &[u8], args: &[Range<usize>], name: &str) -> CommandError {
    let first: Vec<String> = args[1..]
        .iter()
        .take(4)
        .map(|r| {
            format!(
                "'{}'",
                String::from_utf8_lossy(&buf[r.clone()])
                    .chars()
                    .take(64)
                    .collect::<String>()
            )
        })
        .collect();
    let name: String = name.chars().take(64).collect();
    err(format!(
        "unknown command '{name}', with args beginning with: {}",
        first.join(" ")
    ))
}

fn hello<'a>(buf: &'a [u8], args: &[Range<usize>]) -> Result<Command<'a>, CommandError> {
    let arg = |i: usize| &buf[args[i].clone()];
    let version = match args.len() {
        1 => None,
        _ => match arg(1) {
            b"2" => Some(2),
            b"3" => Some(3),
            other if other.iter().all(u8::is_ascii_digit) && !other.is_empty() => {
                return Err(CommandError("NOPROTO unsupported protocol version".into()));
            }
            _ => return Err(err("Protocol version is not an integer or out of range")),
        },
    };
    let mut setname = None;
    let mut i = 2;
    while i < args.len() {
        let option = arg(i).to_ascii_uppercase();
        match option.as_slice() {
            b"SETNAME" if i + 1 < args.len() => {
                setname = Some(utf8("SETNAME", arg(i + 1))?);
                i += 2;
            }
            b"AUTH" => {
                return Err(err(
                    "AUTH: damper-agentd has no users; connect without credentials",
                ));
            }
            _ => {
                return Err(err(format!(
                    "syntax error in HELLO option '{}'",
                    String::from_utf8_lossy(arg(i))
                )));
            }
        }
    }
    Ok(Command::Hello { version, setname })
}

fn client<'a>(buf: &'a [u8], args: &[Range<usize>]) -> Result<Command<'a>, CommandError> {
    let arg = |i: usize| &buf[args[i].clone()];
    if args.len() < 2 {
        return Err(arity("client"));
    }
    let sub = arg(1).to_ascii_uppercase();
    Ok(match (sub.as_slice(), args.len()) {
        (b"SETNAME", 3) => {
            let name = utf8("name", arg(2))?;
            if name.contains(|c: char| c == ' ' || c.is_control()) {
                return Err(err(
                    "Client names cannot contain spaces, newlines or special characters.",
                ));
            }
            Command::SetName(name)
        }
        (b"GETNAME", 2) => Command::GetName,
        (b"ID", 2) => Command::ClientId,
        (b"SETINFO", 4) => Command::Accepted,
        (b"SETNAME" | b"GETNAME" | b"ID" | b"SETINFO", _) => {
            return Err(err(format!(
                "wrong number of arguments for 'client|{}' command",
                String::from_utf8_lossy(&sub).to_ascii_lowercase()
            )));
        }
        _ => {
            return Err(err(format!(
                "unknown subcommand '{}'. Try CLIENT HELP.",
                String::from_utf8_lossy(arg(1))
            )));
        }
    })
}

fn command(buf: &[u8], args: &[Range<usize>]) -> CommandQuery {
    let arg = |i: usize| &buf[args[i].clone()];
    if args.len() == 1 {
        return CommandQuery::All;
    }
    match arg(1).to_ascii_uppercase().as_slice() {
        b"COUNT" => CommandQuery::Count,
        b"INFO" => CommandQuery::Info(
            args[2..]
                .iter()
                .map(|r| String::from_utf8_lossy(&buf[r.clone()]).to_ascii_lowercase())
                .collect(),
        ),
        _ => CommandQuery::Docs,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resp::frame::next_command;

    fn parse(line: &str) -> Result<Command<'_>, CommandError> {
        let (args, _) = next_command(line.as_bytes(), 1024).unwrap().unwrap();
        Command::parse(line.as_bytes(), &args)
    }

    #[test]
    fn damper_commands_read_their_fields() {
        assert_eq!(
            parse("damper.check acme messages 1001\n").unwrap(),
            Command::Check {
                account: "acme",
                op: "messages",
                cost: 1001,
                publisher: None,
            }
        );
        assert_eq!(
            parse("DAMPER.CHECK acme messages\n").unwrap(),
            Command::Check {
                account: "acme",
                op: "messages",
                cost: 1,
                publisher: None,
            }
        );
        assert_eq!(
            parse("DAMPER.CHECK acme messages 51 from conn-7\n").unwrap(),
            Command::Check {
                account: "acme",
                op: "messages",
                cost: 51,
                publisher: Some("conn-7"),
            }
        );
        assert_eq!(
            parse("Damper.Peek acme messages\n").unwrap(),
            Command::Peek {
                account: "acme",
                op: "messages"
            }
        );
    }

    #[test]
    fn bad_arguments_are_redis_style_errors_naming_the_field() {
        for (line, says) in [
            (
                "DAMPER.CHECK acme\n",
                "ERR wrong number of arguments for 'damper.check' command",
            ),
            ("DAMPER.CHECK a b 1 2\n", "wrong number of arguments"),
            ("DAMPER.CHECK a b 1 FROM\n", "wrong number of arguments"),
            (
                "DAMPER.CHECK a b 1 BY p\n",
                "ERR syntax error: expected FROM",
            ),
            ("DAMPER.CHECK a b x FROM p\n", "ERR cost:"),
            (
                "DAMPER.CHECK a b -1\n",
                "ERR cost: not a non-negative integer",
            ),
            ("DAMPER.CHECK a b 1.5\n", "ERR cost:"),
            ("DAMPER.CHECK a b +1\n", "ERR cost:"),
            ("DAMPER.CHECK a b 18446744073709551616\n", "ERR cost:"),
            (
                "DAMPER.PEEK a\n",
                "wrong number of arguments for 'damper.peek'",
            ),
            (
                "FLUSHALL now\n",
                "ERR unknown command 'FLUSHALL', with args beginning with: 'now'",
            ),
            ("HELLO 4\n", "NOPROTO"),
            ("HELLO x\n", "Protocol version is not an integer"),
            ("HELLO 3 AUTH u p\n", "AUTH"),
            ("CLIENT KILL x\n", "unknown subcommand 'KILL'"),
            (
                "CLIENT SETNAME\n",
                "wrong number of arguments for 'client|setname'",
            ),
            ("SELECT 1\n", "DB index is out of range"),
        ] {
            let e = parse(line).unwrap_err().0;
            assert!(e.contains(says), "{line:?}: {e}");
        }
        let bad_utf8 = b"*3\r\n$12\r\nDAMPER.CHECK\r\n$1\r\n\xff\r\n$1\r\nm\r\n";
        let (args, _) = next_command(bad_utf8, 1024).unwrap().unwrap();
        assert_eq!(
            Command::parse(bad_utf8, &args).unwrap_err().0,
            "ERR account: not valid UTF-8"
        );
    }

    #[test]
    fn what_clients_send_on_connecting_is_understood() {
        assert_eq!(
            parse("HELLO 3 SETNAME edge\n").unwrap(),
            Command::Hello {
                version: Some(3),
                setname: Some("edge")
            }
        );
        assert_eq!(
            parse("HELLO\n").unwrap(),
            Command::Hello {
                version: None,
                setname: None
            }
        );
        assert_eq!(
            parse("CLIENT SETINFO LIB-NAME redis-py\n").unwrap(),
            Command::Accepted
        );
        assert_eq!(
            parse("client setname worker-1\n").unwrap(),
            Command::SetName("worker-1")
        );
        assert_eq!(parse("SELECT 0\n").unwrap(), Command::Accepted);
        assert_eq!(
            parse("CONFIG GET save\n").unwrap(),
            Command::ConfigGet(vec!["save".into()])
        );
        assert_eq!(
            parse("COMMAND DOCS\n").unwrap(),
            Command::Command(CommandQuery::Docs)
        );
        assert_eq!(
            parse("COMMAND INFO damper.check\n").unwrap(),
            Command::Command(CommandQuery::Info(vec!["damper.check".into()]))
        );
        assert_eq!(parse("PING\n").unwrap(), Command::Ping(None));
    }

    proptest::proptest! {
        /// Any arguments, known command names among them, are a command or
        /// an error line; never a panic.
        #[test]
        fn arbitrary_arguments_never_panic(
            name in proptest::prop_oneof![
                proptest::strategy::Just(b"DAMPER.CHECK".to_vec()),
                proptest::strategy::Just(b"hello".to_vec()),
                proptest::strategy::Just(b"CLIENT".to_vec()),
                proptest::strategy::Just(b"COMMAND".to_vec()),
                proptest::collection::vec(proptest::arbitrary::any::<u8>(), 0..12),
            ],
            rest in proptest::collection::vec(proptest::collection::vec(proptest::arbitrary::any::<u8>(), 0..20), 0..6),
        ) {
            let mut buf = name.clone();
            let mut args = Vec::with_capacity(rest.len() + 1);
            args.push(0..name.len());
            for a in &rest {
                let start = buf.len();
                buf.extend_from_slice(a);
                args.push(start..buf.len());
            }
            if let Err(e) = Command::parse(&buf, &args) {
                proptest::prop_assert!(e.0.starts_with("ERR ") || e.0.starts_with("NOPROTO"), "{}", e.0);
            }
        }
    }
}
