//! systemd's manager, however it is reachable: root asks the system manager, everyone else their own
//! user manager. Each is tried first over its bus (the system bus; the user bus at
//! `DBUS_SESSION_BUS_ADDRESS`, else `$XDG_RUNTIME_DIR/bus`), then over the manager's private socket
//! (`/run/systemd/private`; `$XDG_RUNTIME_DIR/systemd/private`), which systemd's own tools
//! (`systemctl --user`, `systemd-run --user`) use the same way and which exists whenever the manager
//! runs, with or without a user bus (`dbus-user-session`). The private socket speaks D-Bus peer to
//! peer: no bus daemon, no `Hello`, so `busctl` (which always says `Hello`) cannot use it; the bus is
//! asked through zbus, the private socket through `private.rs` (the call built by zbus).

use std::path::{Path, PathBuf};
use std::time::Duration;

use zbus::connection::Builder;

use super::error::LaunchError;

/// Which manager: the machine's, or the calling user's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Which {
    /// The system manager (root).
    System,
    /// The user's own manager (everyone else).
    User,
}

/// The ways to a manager, tried in order: its bus's address, then its private socket.
#[derive(Clone, Debug)]
pub(super) struct Ways {
    which: Which,
    bus: String,
    private: PathBuf,
}

impl Ways {
    /// The ways to the manager the effective user asks, from this process's environment.
    pub(super) fn for_caller() -> Ways {
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        if nix::unistd::Uid::effective().is_root() {
            Ways {
                which: Which::System,
                bus: env("DBUS_SYSTEM_BUS_ADDRESS")
                    .unwrap_or_else(|| "unix:path=/run/dbus/system_bus_socket".into()),
                private: PathBuf::from("/run/systemd/private"),
            }
        } else {
            let runtime = env("XDG_RUNTIME_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| {
                    PathBuf::from(format!(
                        "/run/user/{}",
                        nix::unistd::Uid::effective().as_raw()
                    ))
                });
            Ways::user(&runtime, env("DBUS_SESSION_BUS_ADDRESS"))
        }
    }

    /// The ways to a user's manager whose runtime directory is `runtime`.
    fn user(runtime: &std::path::Path, bus: Option<String>) -> Ways {
        Ways {
            which: Which::User,
            bus: bus.unwrap_or_else(|| format!("unix:path={}", runtime.join("bus").display())),
            private: runtime.join("systemd/private"),
        }
    }

    fn bus_name(&self) -> &'static str {
        match self.which {
            Which::System => "the system bus",
            Which::User => "the user bus",
        }
    }
}

/// How a manager is reached: a zbus connection on its bus, or its private socket.
enum Conn {
    Bus(zbus::Connection),
    Private(PathBuf),
}

/// A connection to a manager, and the way it was reached (for messages).
pub(super) struct Manager {
    conn: Conn,
    /// "the user bus", or the private socket's path.
    pub(super) via: String,
    within: Duration,
}

/// What is said when no way reached the manager.
fn advice(which: Which) -> &'static str {
    match which {
        Which::System => {
            "is systemd running as this machine's init? (memwatch launch uses a cgroup of its own where it is not)"
        }
        Which::User => {
            "your user manager is not running: log in (a login session starts it), or have root run \
             `loginctl enable-linger $USER` so that it runs without one; a user bus helps too (Debian: \
             apt install dbus-user-session)"
        }
    }
}

impl Manager {
    /// Reaches `which` within `within`: its bus, else its private socket.
    pub(super) async fn reach(ways: &Ways, within: Duration) -> Result<Manager, LaunchError> {
        let mut tried = Vec::new();
        let name = ways.bus_name();
        match Builder::address(ways.bus.as_str()) {
            Ok(b) => match tokio::time::timeout(within, b.method_timeout(within).build()).await {
                Ok(Ok(conn)) => {
                    return Ok(Manager {
                        conn: Conn::Bus(conn),
                        via: name.into(),
                        within,
                    });
                }
                Ok(Err(e)) => tried.push(format!("{name} ({}): {e}", ways.bus)),
                Err(_) => tried.push(format!(
                    "{name} ({}): no answer within {within:?}",
                    ways.bus
                )),
            },
            Err(e) => tried.push(format!("{name} ({}): {e}", ways.bus)),
        }
        let private = &ways.private;
        let shown = private.display().to_string();
        // The manager listens there: the call itself makes its own connection.
        match std::os::unix::net::UnixStream::connect(private) {
            Ok(_) => {
                return Ok(Manager {
                    conn: Conn::Private(private.clone()),
                    via: shown,
                    within,
                });
            }
            Err(e) => tried.push(format!("{shown}: {e}")),
        }
        Err(LaunchError::NoManager {
            tried: tried.join("; "),
            advice: advice(ways.which),
        })
    }

    /// `StartTransientUnit(unit, "fail", properties, [])`: the scope around `pid`, collected when
    /// it ends, with `MemoryMax` when given.
    pub(super) async fn start_scope(
        &self,
        unit: &str,
        pid: u32,
        memory_max: Option<u64>,
    ) -> Result<(), LaunchError> {
        let description = format!("memwatch launch: {unit}");
        let mut props: Vec<(&str, zbus::zvariant::Value<'_>)> = vec![
            ("PIDs", vec![pid].into()),
            ("Description", description.as_str().into()),
            ("CollectMode", "inactive-or-failed".into()),
        ];
        if let Some(bytes) = memory_max {
            props.push(("MemoryMax", bytes.into()));
        }
        let aux: Vec<(&str, Vec<(&str, zbus::zvariant::Value<'_>)>)> = Vec::new();
        let body = (unit, "fail", props, aux);
        let conn = match &self.conn {
            Conn::Bus(c) => c,
            Conn::Private(socket) => return self.start_privately(socket, unit, &body),
        };
        conn.call_method(
            Some("org.freedesktop.systemd1"),
            "/org/freedesktop/systemd1",
            Some("org.freedesktop.systemd1.Manager"),
            "StartTransientUnit",
            &body,
        )
        .await
        .map(drop)
        .map_err(|e| match e {
            zbus::Error::MethodError(name, detail, _) => LaunchError::ScopeRefused {
                unit: unit.to_owned(),
                error: name.to_string(),
                detail: detail.unwrap_or_default(),
                via: self.via.clone(),
            },
            other => LaunchError::Bus {
                unit: unit.to_owned(),
                via: self.via.clone(),
                error: other.to_string(),
            },
        })
    }
}

impl Manager {
    /// The same call over the private socket (`private.rs`).
    fn start_privately<B>(&self, socket: &Path, unit: &str, body: &B) -> Result<(), LaunchError>
    where
        B: serde::Serialize + zbus::zvariant::DynamicType,
    {
        let bus = |error: String| LaunchError::Bus {
            unit: unit.to_owned(),
            via: self.via.clone(),
            error,
        };
        let msg = zbus::Message::method_call("/org/freedesktop/systemd1", "StartTransientUnit")
            .and_then(|b| b.destination("org.freedesktop.systemd1"))
            .and_then(|b| b.interface("org.freedesktop.systemd1.Manager"))
            .and_then(|b| b.build(body))
            .map_err(|e| bus(e.to_string()))?;
        match super::private::call(socket, &msg, self.within) {
            Ok(super::private::Answer::Done) => Ok(()),
            Ok(super::private::Answer::Error { name, message }) => Err(LaunchError::ScopeRefused {
                unit: unit.to_owned(),
                error: name,
                detail: message,
                via: self.via.clone(),
            }),
            Err(e) => Err(bus(e.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A user's ways are under their runtime directory: the bus, then the manager's own socket.
    #[test]
    fn a_users_ways_are_under_their_runtime_directory() {
        let w = Ways::user(std::path::Path::new("/run/user/1000"), None);
        assert_eq!(w.bus, "unix:path=/run/user/1000/bus");
        assert_eq!(w.private, PathBuf::from("/run/user/1000/systemd/private"));
        let w = Ways::user(
            std::path::Path::new("/run/user/1000"),
            Some("unix:path=/tmp/b".into()),
        );
        assert_eq!(w.bus, "unix:path=/tmp/b");
    }

    /// No bus and no private socket: an error that names both tries and says what to do.
    #[test]
    fn a_user_with_no_manager_is_told_what_to_do() {
        let dir = std::env::temp_dir().join(format!("mw-no-manager-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let err = rt
            .block_on(Manager::reach(
                &Ways::user(&dir, None),
                Duration::from_secs(2),
            ))
            .err()
            .expect("nothing listens there");
        let text = err.to_string();
        assert!(
            text.contains(&format!("the user bus (unix:path={}/bus)", dir.display())),
            "{text}"
        );
        assert!(
            text.contains(&format!("{}/systemd/private", dir.display())),
            "{text}"
        );
        assert!(text.contains("loginctl enable-linger"), "{text}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
