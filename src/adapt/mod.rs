//! Adapting a job to the machine: the directives, the trainer's progress and their checks are
//! memwatch-core's (`memwatch_core::adapt`, re-exported here); a job's token is drawn here, from the
//! kernel's random pool.

pub use memwatch_core::adapt::*;

/// A new job token: 128 bits from the kernel's random pool (getrandom(2), which blocks only until the
/// pool is first seeded at boot). Fails rather than hand out a guessable token.
pub fn new_token() -> Result<String, TokenError> {
    let mut buf = [0u8; 16];
    let mut filled = 0;
    while filled < buf.len() {
        match rustix::rand::getrandom(&mut buf[filled..], rustix::rand::GetRandomFlags::empty()) {
            Ok(n) => filled += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(TokenError(memwatch_core::host::Errno(e.raw_os_error()))),
        }
    }
    Ok(token_text(&buf))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_random_and_a_zero_token_never_matches() {
        let (a, b) = (new_token().unwrap(), new_token().unwrap());
        assert!(token_is_sound(&a) && token_is_sound(&b), "{a} {b}");
        assert_ne!(a, b);
        assert!(token_matches(&a, &a));
        assert!(!token_matches(&a, &b));
        let zero = "0".repeat(32);
        assert!(!token_matches(&zero, &zero), "a zero token was accepted");
        assert!(!token_matches("", ""));
        assert!(!token_matches("abc", "abc"), "a short token was accepted");
    }
}
