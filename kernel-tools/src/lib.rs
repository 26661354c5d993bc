//! The kernel tools of nexus: the catalog and the effect-profile vocabulary.
//!
//! Owns: each kernel tool's canonical name (`source.category.name`), its stored wire name and its
//! effect profile (spec/REFERENCE.md section 5), the reserved namespaces that no executor may
//! announce, and [`EffectProfile`] with its closed vocabulary and the replayability rule that
//! expiry classification reads (REFERENCE.md 6.10).
//!
//! Does not own: sockets, actors or storage. Pure code.

pub mod catalog;
pub mod effect;

pub use catalog::{CATALOG, KernelTool, RESERVED_NAMESPACES, lookup, reserved_namespace_of};
pub use effect::{EffectProfile, EffectProfileError};
