//! A test that cannot run here fails, unless the run allows it by name: `MEMWATCH_ALLOW_SKIP`, a
//! comma-separated list of the names the tests give (`reflex`, `vm`, `torch` …). A test never passes
//! by returning early unasked.

/// Says the test named `name` cannot run here because `why`: panics unless `MEMWATCH_ALLOW_SKIP`
/// names it, else says it was skipped. The caller returns after it.
pub fn cannot_run(name: &str, why: &str) {
    if allowed(
        name,
        &std::env::var("MEMWATCH_ALLOW_SKIP").unwrap_or_default(),
    ) {
        eprintln!("skipped {name}, allowed by MEMWATCH_ALLOW_SKIP: {why}");
    } else {
        panic!(
            "{name} cannot run here: {why} (MEMWATCH_ALLOW_SKIP={name} allows it to be skipped)"
        );
    }
}

fn allowed(name: &str, list: &str) -> bool {
    list.split(',').any(|a| a.trim() == name)
}
