//! The kernel catalog: canonical names, wire names and effect profiles
//! (spec/REFERENCE.md section 5, the table of 19 tools).

use crate::effect::EffectProfile;

/// One kernel tool's identity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelTool {
    /// `source.category.name`, e.g. `nexus.graph.delegate_task`.
    pub canonical_name: &'static str,
    /// The stored wire name, e.g. `delegate_task`. Stored, never derived.
    pub name: &'static str,
    /// Which effect-profile constant the tool carries.
    pub effect: Effect,
}

/// The catalog's named effect-profile constants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Effect {
    /// read_only / false / closed / intrinsic / none.
    ReadOnlyClosed,
    /// write / false / closed / intrinsic / lookup.
    GraphWrite,
    /// write / true / closed / intrinsic / lookup.
    MemoryWrite,
    /// MEMORY_WRITE with idempotency `none`.
    MemoryEdit,
}

impl Effect {
    /// The constant's profile.
    pub fn profile(self) -> EffectProfile {
        match self {
            Effect::ReadOnlyClosed => EffectProfile::new("read_only", false, "closed", "intrinsic", "none"),
            Effect::GraphWrite => EffectProfile::new("write", false, "closed", "intrinsic", "lookup"),
            Effect::MemoryWrite => EffectProfile::new("write", true, "closed", "intrinsic", "lookup"),
            Effect::MemoryEdit => EffectProfile::new("write", true, "closed", "none", "lookup"),
        }
    }
}

const fn tool(canonical_name: &'static str, name: &'static str, effect: Effect) -> KernelTool {
    KernelTool { canonical_name, name, effect }
}

/// Namespaces no executor may announce, in either spelling (REFERENCE.md 5, newest list).
pub const RESERVED_NAMESPACES: [&str; 5] =
    ["nexus.graph", "nexus.human", "nexus.conversation", "nexus.tools", "nexus.runners"];

/// Every live kernel tool, in catalog order.
pub const CATALOG: [KernelTool; 19] = [
    tool("nexus.graph.delegate_task", "delegate_task", Effect::GraphWrite),
    tool("nexus.graph.wait", "wait", Effect::GraphWrite),
    tool("nexus.human.ask", "ask", Effect::GraphWrite),
    tool("nexus.conversation.spawn", "spawn", Effect::GraphWrite),
    tool("nexus.conversation.send", "send", Effect::GraphWrite),
    tool("nexus.conversation.status", "status", Effect::ReadOnlyClosed),
    tool("nexus.conversation.cancel", "cancel", Effect::GraphWrite),
    tool("nexus.conversation.search", "session_search", Effect::ReadOnlyClosed),
    tool("nexus.conversation.read", "session_read", Effect::ReadOnlyClosed),
    tool("nexus.memory.read", "memory_read", Effect::ReadOnlyClosed),
    tool("nexus.memory.write", "memory_write", Effect::MemoryWrite),
    tool("nexus.memory.edit", "memory_edit", Effect::MemoryEdit),
    tool("nexus.memory.ls", "memory_ls", Effect::ReadOnlyClosed),
    tool("nexus.memory.grep", "memory_grep", Effect::ReadOnlyClosed),
    tool("nexus.memory.delete", "memory_delete", Effect::MemoryWrite),
    tool("nexus.skill.load", "skill", Effect::ReadOnlyClosed),
    tool("nexus.tools.search", "tool_search", Effect::ReadOnlyClosed),
    tool("nexus.tools.call", "tool_call", Effect::GraphWrite),
    tool("nexus.runners.list", "runners_list", Effect::ReadOnlyClosed),
];

/// Resolves a canonical name or a wire name to its kernel tool.
pub fn lookup(name: &str) -> Option<&'static KernelTool> {
    CATALOG.iter().find(|t| t.canonical_name == name || t.name == name)
}

/// The reserved namespace a name belongs to, in either spelling: a canonical name under the
/// namespace, or the wire name of a tool under it.
pub fn reserved_namespace_of(name: &str) -> Option<&'static str> {
    let canonical = lookup(name).map_or(name, |t| t.canonical_name);
    RESERVED_NAMESPACES
        .iter()
        .copied()
        .find(|ns| canonical.strip_prefix(ns).is_some_and(|rest| rest.is_empty() || rest.starts_with('.')))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalog_has_nineteen_unique_tools() {
        let mut names = std::collections::HashSet::new();
        for tool in CATALOG {
            assert!(names.insert(tool.name));
            assert!(names.insert(tool.canonical_name));
        }
        assert_eq!(names.len(), 38);
    }

    #[test]
    fn reserved_namespaces_in_either_spelling() {
        assert_eq!(reserved_namespace_of("delegate_task"), Some("nexus.graph"));
        assert_eq!(reserved_namespace_of("nexus.human.ask"), Some("nexus.human"));
        assert_eq!(reserved_namespace_of("runners_list"), Some("nexus.runners"));
        assert_eq!(reserved_namespace_of("nexus.tools.anything"), Some("nexus.tools"));
        // Memory is overridable and skill is routed by source: neither is reserved.
        assert_eq!(reserved_namespace_of("memory_read"), None);
        assert_eq!(reserved_namespace_of("skill"), None);
        assert_eq!(reserved_namespace_of("bash"), None);
    }
}
