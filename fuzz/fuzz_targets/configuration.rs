//! The body of `PUT /agent_api/v1/profile/configuration`: the door's JSON parse and the whole declaration grammar, then the approval stage over the accepted rules.
//! The properties checked are those of `nexus_actors::fuzzing::profile_put` (`docs/fuzzing.md`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = nexus_actors::fuzzing::profile_put(data);
});
