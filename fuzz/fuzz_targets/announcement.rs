//! A runner's announcement body: the executor's JSON parse and the announcement grammar.
//! The properties checked are those of `nexus_actors::fuzzing::announcement` (`docs/fuzzing.md`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = nexus_actors::fuzzing::announcement(data);
});
