//! A stand-in for the daemon, as memwatch-train sees it: the control socket (attach answers with a
//! token) and the trainer's HTTP endpoints (no directives, progress taken). It records every HTTP
//! request, and answers the out-of-memory reports as told: the first with `first_oom_status` (404 is
//! a daemon that does not know the endpoint yet), the others with `{"ok": true}`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

pub const TOKEN: &str = "fake-token-0123";

#[derive(Debug, Clone)]
pub struct Request {
    pub method: String,
    pub path: String,
    pub authorization: Option<String>,
    pub body: String,
}

pub struct Daemon {
    pub socket: PathBuf,
    pub url: String,
    requests: Arc<Mutex<Vec<Request>>>,
}

impl Daemon {
    pub fn start(dir: &Path, first_oom_status: u16) -> Daemon {
        let socket = dir.join("control.sock");
        let unix = UnixListener::bind(&socket).unwrap();
        std::thread::spawn(move || {
            for stream in unix.incoming().flatten() {
                let mut line = String::new();
                if BufReader::new(&stream).read_line(&mut line).is_ok() {
                    let _ = (&stream)
                        .write_all(format!("{{\"ok\":true,\"token\":\"{TOKEN}\"}}\n").as_bytes());
                }
            }
        });
        let http = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", http.local_addr().unwrap());
        let requests = Arc::new(Mutex::new(Vec::new()));
        let seen = requests.clone();
        std::thread::spawn(move || {
            let mut ooms = 0;
            for stream in http.incoming().flatten() {
                let Some(req) = read_request(&stream) else {
                    continue;
                };
                let (status, body) = if req.path.ends_with("/oom") {
                    ooms += 1;
                    if ooms == 1 && first_oom_status != 200 {
                        (first_oom_status, r#"{"error":"not found"}"#)
                    } else {
                        (200, r#"{"ok":true}"#)
                    }
                } else if req.path.contains("/directives") {
                    (200, r#"{"generation":0,"directives":[],"knobs":{}}"#)
                } else {
                    (200, r#"{"ok":true}"#)
                };
                seen.lock().unwrap().push(req);
                let _ = (&stream).write_all(
                    format!(
                        "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    )
                    .as_bytes(),
                );
            }
        });
        Daemon {
            socket,
            url,
            requests,
        }
    }

    /// The out-of-memory reports received, as JSON, with their Authorization headers.
    pub fn ooms(&self) -> Vec<(Option<String>, serde_json::Value)> {
        self.requests
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.method == "POST" && r.path.ends_with("/oom"))
            .map(|r| {
                (
                    r.authorization.clone(),
                    serde_json::from_str(&r.body).unwrap(),
                )
            })
            .collect()
    }
}

fn read_request(stream: &std::net::TcpStream) -> Option<Request> {
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next()?.to_owned(), parts.next()?.to_owned());
    let (mut length, mut authorization) = (0, None);
    loop {
        let mut header = String::new();
        reader.read_line(&mut header).ok()?;
        let header = header.trim_end();
        if header.is_empty() {
            break;
        }
        let (name, value) = header.split_once(':')?;
        match name.to_ascii_lowercase().as_str() {
            "content-length" => length = value.trim().parse().ok()?,
            "authorization" => authorization = Some(value.trim().to_owned()),
            _ => {}
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    Some(Request {
        method,
        path,
        authorization,
        body: String::from_utf8(body).ok()?,
    })
}
