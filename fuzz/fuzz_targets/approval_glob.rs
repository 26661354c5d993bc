//! The approval glob matcher against the plain quadratic reading of a glob.
//! The properties checked are those of `nexus_actors::fuzzing::glob` (`docs/fuzzing.md`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = nexus_actors::fuzzing::glob(data);
});
