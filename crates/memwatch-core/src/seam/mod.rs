//! The host seam: what the engine reads of the host ([`HostView`]) and what it does to it
//! ([`HostDriver`]), with their errors, and [`release`], which undoes a pause from its record alone
//! through any driver. The `memwatch` crate implements both on the machine
//! (`view::RootView`, `act::driver::Host`); the engine's simulator (`engine::sim`, a host in
//! memory) answers and records instead.

mod driver;
mod error;
mod view;

pub use crate::host::Errno;
pub use crate::host::{Pinned, pinned_open};
pub use crate::slurm::call::{HOLD_TRIES, SlurmAnswer, SlurmCall, SlurmError};
pub use driver::{HostDriver, Released, release, undo_pause, unmark};
pub use error::{CallError, CgroupError, SignalError};
pub use view::{HostView, may_signal};

#[cfg(test)]
mod tests {
    /// The methods of the trait `name` in `source` that have a body (a default) rather than ending
    /// at their signature's `;`.
    fn defaults(source: &str, name: &str) -> Vec<String> {
        let start = source
            .find(&format!("pub trait {name}"))
            .unwrap_or_else(|| panic!("no trait {name}"));
        let body = &source[start..];
        let open = body.find('{').expect("the trait's body");
        let (mut depth, mut out, mut at) = (0usize, Vec::new(), open);
        let bytes = body.as_bytes();
        while at < bytes.len() {
            match bytes[at] {
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                }
                b'f' if depth == 1 && body[at..].starts_with("fn ") => {
                    let sig = &body[at..];
                    let end = sig.find([';', '{']).expect("a signature's end");
                    if sig.as_bytes()[end] == b'{' {
                        let name = sig[3..].split(['(', '<']).next().unwrap_or("");
                        out.push(name.to_owned());
                    }
                }
                _ => {}
            }
            at += 1;
        }
        out
    }

    /// No read or act of the seam has a default: a new host call is answered by every driver (the
    /// machine's, the simulator's) because the compiler asks each for it (ARCHITECTURE.md's
    /// recipes count on that). `HostView`'s only provided methods are these rules over its own
    /// reads, which no driver answers itself.
    #[test]
    fn the_seam_traits_have_no_default_read_or_act() {
        assert_eq!(
            defaults(include_str!("driver.rs"), "HostDriver"),
            Vec::<String>::new()
        );
        assert_eq!(
            defaults(include_str!("view.rs"), "HostView"),
            [
                "owner_may_signal",
                "owner_may_freeze",
                "within_reach",
                "slurm_tasks"
            ]
        );
        // The check finds a default where there is one.
        let made_up =
            "pub trait T {\n    fn a(&self);\n    fn b(&self) -> bool {\n        false\n    }\n}\n";
        assert_eq!(defaults(made_up, "T"), vec!["b".to_owned()]);
    }
}
