//! The kernel tools of nexus: the catalog, the alias grammar and the effect-profile vocabulary.
//!
//! Owns: each kernel tool's canonical name (`source.category.name`), its stored wire name, its
//! definition (schema bytes and description, with tool-name macros) and its effect profile
//! (`docs/declaration.md`, "Kernel imports"); the reserved namespaces that no executor may announce
//! (`docs/protocol.md`, "Announce"); the alias grammar, its rendering and call resolution
//! (`docs/declaration.md`, "Aliases"); and [`EffectProfile`] with its closed vocabulary and the
//! replayability rule that expiry classification reads (`docs/protocol.md`, "Expiry").
//!
//! Also each kernel tool's pure grammar where the server needs one: [`ask`] (a call of
//! `nexus.human.ask` and the answer a person gives to it).
//!
//! Main types: [`KernelTool`] (with [`KernelTool::definition`] and [`KernelTool::template`]),
//! [`CatalogEntry`] (a row of `GET /agent_api/v1/tools`), [`Spellings`] (how a tool set spells
//! the kernel tools), [`Alias`] and [`ResolvedCall`].
//!
//! Does not own: sockets, actors or storage. Pure code.

pub mod alias;
pub mod ask;
pub mod catalog;
pub mod effect;
pub mod macros;
mod templates;

pub use alias::{Alias, AliasError, AliasParam, AliasWord, ResolvedCall, canonicalize_alias, is_alias, resolve_call};
pub use catalog::{
    CATALOG, CatalogEntry, Effect, KernelTool, ParamType, RESERVED_NAMESPACES, SERVED, catalog_entries, catalog_json,
    live, live_names, lookup, reserved_namespace_of, served,
};
pub use effect::{EffectKind, EffectProfile, EffectProfileError, EffectScope, Idempotency, Reconciliation};
pub use macros::Spellings;
