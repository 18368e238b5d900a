//! For the unit tests: a test that cannot run here fails, unless the run allows it by name
//! (`MEMWATCH_ALLOW_SKIP`, comma-separated), as tests/common/skip.rs does for the integration tests.

/// Says the test named `name` cannot run here because `why`: panics unless `MEMWATCH_ALLOW_SKIP`
/// names it, else says it was skipped. The caller returns after it.
pub fn cannot_run(name: &str, why: &str) {
    let allowed = std::env::var("MEMWATCH_ALLOW_SKIP").unwrap_or_default();
    if allowed.split(',').any(|a| a.trim() == name) {
        eprintln!("skipped {name}, allowed by MEMWATCH_ALLOW_SKIP: {why}");
    } else {
        panic!(
            "{name} cannot run here: {why} (MEMWATCH_ALLOW_SKIP={name} allows it to be skipped)"
        );
    }
}
