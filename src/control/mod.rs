//! The control socket: `attach`, `detach`, `pause`, `resume`, `jobs`. One JSON object per line each way.
//! The daemon takes the caller's uid from the socket (SO_PEERCRED), never from the message.

pub mod client;
pub mod prepare;
pub mod server;

pub use memwatch_core::control::*;
