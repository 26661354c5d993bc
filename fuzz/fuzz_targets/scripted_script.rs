//! A scripted-model script: its parser, then every round played against a transcript built from the input.
//! The properties checked are those of `nexus_actors::fuzzing::scripted_script` (`docs/fuzzing.md`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = nexus_actors::fuzzing::scripted_script(data);
});
