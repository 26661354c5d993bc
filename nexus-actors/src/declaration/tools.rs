//! The tool grammar: `tool_definitions` (ordinary functions, exact kernel entries, kernel aliases,
//! runner-routed callables), `kernel_tools`, the runner fields, assembly of a frozen tool set
//! (explicit entries, kernel imports, runner imports with collision names), call resolution and the
//! provider wire projection (`docs/declaration.md`, "Tool definitions" through "Wire projection").
//! The kernel catalog and the alias grammar themselves live in `nexus-kernel-tools`.

mod assembly;
mod frozen;
mod grammar;
#[cfg(test)]
mod tests;
mod wire;

pub use assembly::*;
pub use frozen::*;
pub use grammar::*;
pub use wire::*;
