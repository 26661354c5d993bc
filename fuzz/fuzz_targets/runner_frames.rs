//! Length-delimited runner frames: protobuf decoding, the connection's request decoding (batches among them) and the executor's checks before it reads the store.
//! The properties checked are those of `nexus_actors::fuzzing::runner_frames` (`docs/fuzzing.md`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = nexus_actors::fuzzing::runner_frames(data);
});
