//! One method call to systemd over its manager's private socket (`$XDG_RUNTIME_DIR/systemd/private`,
//! `/run/systemd/private`): D-Bus peer to peer, as `systemctl --user` speaks it when there is no
//! user bus. The call is built by zbus (`Message::method_call`); the connection is this file's: the
//! SASL `EXTERNAL` handshake, the call's bytes, and the reply read up to its type, its reply serial
//! and, for an error, its name and message. zbus's own connection cannot be used here: systemd
//! sends its replies on this socket from the well-known name `org.freedesktop.systemd1`, which
//! zbus 5 takes for a unique name and panics on in its socket reader.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

/// What the manager answered to a call.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Answer {
    /// A method return.
    Done,
    /// An error reply: its name and message.
    Error { name: String, message: String },
}

/// Why the call got no answer.
#[derive(Debug, thiserror::Error)]
pub(super) enum PrivateError {
    /// Connecting, writing or reading the socket failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The manager refused the handshake.
    #[error("the manager refused EXTERNAL authentication: {0:?}")]
    Refused(String),
    /// The call could not be built.
    #[error("{0}")]
    Build(#[from] zbus::Error),
    /// A reply that is not D-Bus.
    #[error("a malformed reply: {0}")]
    Malformed(&'static str),
    /// No reply in time.
    #[error("no reply within {0:?}")]
    Late(Duration),
}

/// Calls `msg` (a method call zbus built) on the manager listening at `socket`, within `within`.
pub(super) fn call(
    socket: &Path,
    msg: &zbus::Message,
    within: Duration,
) -> Result<Answer, PrivateError> {
    let started = Instant::now();
    let mut stream = UnixStream::connect(socket)?;
    stream.set_read_timeout(Some(within))?;
    stream.set_write_timeout(Some(within))?;
    // SASL: EXTERNAL with our uid, in hex of its decimal digits.
    let uid = nix::unistd::Uid::effective().as_raw().to_string();
    let hex: String = uid.bytes().map(|b| format!("{b:02x}")).collect();
    stream.write_all(format!("\0AUTH EXTERNAL {hex}\r\n").as_bytes())?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    if !line.starts_with("OK ") {
        return Err(PrivateError::Refused(line.trim().to_owned()));
    }
    stream.write_all(b"BEGIN\r\n")?;
    stream.write_all(msg.data())?;
    let serial = msg.primary_header().serial_num().get();
    loop {
        if started.elapsed() >= within {
            return Err(PrivateError::Late(within));
        }
        let reply = read_message(&mut reader, within)?;
        let parsed = parse(&reply)?;
        if parsed.reply_serial != Some(serial) {
            continue; // a signal, or another's: not our answer
        }
        return Ok(match parsed.kind {
            METHOD_RETURN => Answer::Done,
            ERROR => Answer::Error {
                name: parsed.error_name.unwrap_or_default(),
                message: parsed.message.unwrap_or_default(),
            },
            _ => {
                return Err(PrivateError::Malformed(
                    "a reply that is neither a return nor an error",
                ));
            }
        });
    }
}

const METHOD_RETURN: u8 = 2;
const ERROR: u8 = 3;

/// One whole message off the socket (read with a timeout of `within`): the fixed header, the
/// header fields, the body.
fn read_message(r: &mut impl Read, within: Duration) -> Result<Vec<u8>, PrivateError> {
    let mut buf = vec![0u8; 16];
    r.read_exact(&mut buf).map_err(|e| match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => PrivateError::Late(within),
        _ => PrivateError::Io(e),
    })?;
    let u32_at = |b: &[u8], at: usize| -> Option<u32> {
        let x: [u8; 4] = b.get(at..at + 4)?.try_into().ok()?;
        Some(if b[0] == b'B' {
            u32::from_be_bytes(x)
        } else {
            u32::from_le_bytes(x)
        })
    };
    let body = u32_at(&buf, 4).ok_or(PrivateError::Malformed("short header"))? as usize;
    let fields = u32_at(&buf, 12).ok_or(PrivateError::Malformed("short header"))? as usize;
    let total = align(16 + fields, 8) + body;
    if total > 1 << 20 {
        return Err(PrivateError::Malformed("a reply of more than 1 MiB"));
    }
    buf.resize(total, 0);
    r.read_exact(&mut buf[16..])?;
    Ok(buf)
}

/// The parts of a message this call needs.
#[derive(Debug, Default, PartialEq, Eq)]
struct Parsed {
    kind: u8,
    reply_serial: Option<u32>,
    error_name: Option<String>,
    /// An error's message: its body's first string.
    message: Option<String>,
}

fn align(at: usize, to: usize) -> usize {
    at.div_ceil(to) * to
}

/// Reads the header fields (code, signature, value: each struct at 8 bytes) for the reply serial
/// (5) and the error name (4), and an error's first body string.
fn parse(m: &[u8]) -> Result<Parsed, PrivateError> {
    let bad = PrivateError::Malformed;
    let big = m.first() == Some(&b'B');
    let u32_at = |at: usize| -> Option<u32> {
        let x: [u8; 4] = m.get(at..at + 4)?.try_into().ok()?;
        Some(if big {
            u32::from_be_bytes(x)
        } else {
            u32::from_le_bytes(x)
        })
    };
    let string_at = |at: usize| -> Option<(String, usize)> {
        let len = u32_at(at)? as usize;
        let s = m.get(at + 4..at + 4 + len)?;
        Some((String::from_utf8_lossy(s).into_owned(), at + 4 + len + 1))
    };
    let mut p = Parsed {
        kind: *m.get(1).ok_or(bad("no type"))?,
        ..Parsed::default()
    };
    let fields_end = 16 + u32_at(12).ok_or(bad("short header"))? as usize;
    let mut at = 16;
    while at < fields_end {
        at = align(at, 8);
        let code = *m.get(at).ok_or(bad("a field past the end"))?;
        let sig_len = *m.get(at + 1).ok_or(bad("a field past the end"))? as usize;
        let sig = *m.get(at + 2).ok_or(bad("a field past the end"))?;
        at += 2 + sig_len + 1;
        match sig {
            b's' | b'o' => {
                at = align(at, 4);
                let (s, next) = string_at(at).ok_or(bad("a string past the end"))?;
                if code == 4 {
                    p.error_name = Some(s);
                }
                at = next;
            }
            b'g' => {
                let len = *m.get(at).ok_or(bad("a signature past the end"))? as usize;
                at += 1 + len + 1;
            }
            b'u' => {
                at = align(at, 4);
                let v = u32_at(at).ok_or(bad("a number past the end"))?;
                if code == 5 {
                    p.reply_serial = Some(v);
                }
                at += 4;
            }
            _ => return Err(bad("a header field of an unknown type")),
        }
    }
    if p.kind == ERROR {
        p.message = string_at(align(fields_end, 8)).map(|(s, _)| s);
    }
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `msg`'s bytes (little-endian) with a sender field added: zbus will not build a message from a
    /// well-known name, which systemd sends on this socket.
    fn with_sender(msg: &zbus::Message, sender: &str) -> Vec<u8> {
        let b = msg.data().to_vec();
        let fields = u32::from_le_bytes(b[12..16].try_into().unwrap()) as usize;
        let body_len = u32::from_le_bytes(b[4..8].try_into().unwrap()) as usize;
        let body = b[b.len() - body_len..].to_vec();
        let mut out = b[..16 + fields].to_vec();
        out.resize(align(out.len(), 8), 0);
        out.extend([7, 1, b's', 0]);
        out.extend((sender.len() as u32).to_le_bytes());
        out.extend(sender.as_bytes());
        out.push(0);
        let fields = out.len() - 16;
        out[12..16].copy_from_slice(&(fields as u32).to_le_bytes());
        out.resize(align(out.len(), 8), 0);
        out.extend(body);
        out
    }

    /// A reply as systemd sends it on its private socket (from `org.freedesktop.systemd1`, the name
    /// zbus's own reader cannot take): read back to its type, reply serial, error name and message.
    #[test]
    fn a_reply_from_a_well_known_name_is_read() {
        let call = zbus::Message::method_call("/org/freedesktop/systemd1", "StartTransientUnit")
            .unwrap()
            .build(&())
            .unwrap();
        let serial = call.primary_header().serial_num().get();
        let err = zbus::Message::error(&call.header(), "org.freedesktop.systemd1.UnitExists")
            .unwrap()
            .build(&("Unit memwatch-t-1-0.scope already exists.",))
            .unwrap();
        let bytes = with_sender(&err, "org.freedesktop.systemd1");
        let got = read_message(&mut bytes.as_slice(), Duration::from_secs(1)).unwrap();
        assert_eq!(got, bytes);
        assert_eq!(
            parse(&got).unwrap(),
            Parsed {
                kind: ERROR,
                reply_serial: Some(serial),
                error_name: Some("org.freedesktop.systemd1.UnitExists".into()),
                message: Some("Unit memwatch-t-1-0.scope already exists.".into()),
            }
        );
        let path = zbus::zvariant::ObjectPath::try_from("/org/freedesktop/systemd1/job/7").unwrap();
        let done = zbus::Message::method_return(&call.header())
            .unwrap()
            .build(&(path,))
            .unwrap();
        let p = parse(&with_sender(&done, "org.freedesktop.systemd1")).unwrap();
        assert_eq!((p.kind, p.reply_serial), (METHOD_RETURN, Some(serial)));
        // Cut short: an error, never a panic.
        assert!(read_message(&mut &bytes[..bytes.len() - 3], Duration::from_secs(1)).is_err());
        assert!(parse(&bytes[..20]).is_err());
    }
}
