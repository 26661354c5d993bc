//! What freezing keeps: the frozen tool set, its routes, and the declaration an execution runs
//! under (`docs/declaration.md`, "Freezing").

use nexus_proto::RunnerId;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use nexus_kernel_tools::{ResolvedCall, lookup as kernel_lookup, resolve_call};

use crate::declaration::memory::ConversationReach;
use crate::declaration::template::Mechanism;

/// The canonical name of the kernel's `skill` tool.
pub const SKILL_CANONICAL: &str = "nexus.skill.load";
/// The canonical name of the kernel's `tool_call` tool.
pub const TOOL_CALL_CANONICAL: &str = "nexus.tools.call";

/// Where a runner callable goes: its frozen target and the served name.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunnerRoute {
    /// The frozen target Runner.
    pub runner_executor_public_id: RunnerId,
    /// The name the runner announced (the collision name never reaches the runner).
    pub tool_name: String,
}

/// One callable in a frozen tool set.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FrozenTool {
    /// The callable name the model sees.
    pub name: String,
    /// The stored entry (`{type:"function", function:{...}, route?, defer_loading?}`).
    pub definition: Value,
    /// The runner route, for runner callables.
    pub route: Option<RunnerRoute>,
    /// The served tool's effect profile at freezing.
    pub effect_profile: Option<Value>,
    /// The served tool's announced `timeout_ms`.
    pub timeout_ms: Option<u64>,
    /// The kernel tool's canonical name, for kernel entries, aliases and kernel imports.
    #[serde(default)]
    pub canonical: Option<String>,
}

impl FrozenTool {
    /// The kernel canonical name this callable runs as, if it is a kernel tool. Declarations
    /// frozen before `canonical` was recorded fall back to the entry's facts and its name.
    pub fn canonical_name(&self) -> Option<&str> {
        if let Some(canonical) = &self.canonical {
            return Some(canonical);
        }
        if let Some(canonical) = self.definition.get("canonical").and_then(Value::as_str) {
            return Some(canonical);
        }
        if self.route.is_some() {
            return None;
        }
        kernel_lookup(&self.name).filter(|tool| tool.name == self.name).map(|tool| tool.canonical_name)
    }

    /// Whether the entry is declared `defer_loading: true`.
    pub fn deferred(&self) -> bool {
        self.definition.get("defer_loading") == Some(&Value::Bool(true))
    }

    /// Resolves a call the model made to this callable (`docs/executions.md`, "Round driver";
    /// `docs/declaration.md`, "Aliases"): a runner callable runs under its frozen served name, an
    /// alias under the kernel wire name with its input mapped, anything else unchanged. `alias` is
    /// the callable name when it differs from `wire_name` (the inbox row's `tool_alias`, the
    /// transcript's `name`).
    pub fn resolve_call(&self, input: &Value) -> ResolvedCall {
        if let Some(route) = &self.route {
            let alias = (route.tool_name != self.name).then(|| self.name.clone());
            return ResolvedCall { wire_name: route.tool_name.clone(), input: input.clone(), alias };
        }
        resolve_call(&self.definition, input)
    }
}

/// One skill an execution may load (`docs/kernel-tools.md`, "skill"): a named document the
/// prompt's skills block lists and `skill {name}` returns. Frozen at materialization from the
/// selected runner's announced `documents`, in the announcement's (name) order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FrozenSkill {
    /// The skill's name (`^[a-z0-9](?:-?[a-z0-9])*$`, at most 64 characters).
    pub name: String,
    /// One line on what it is for (at most 1024 bytes).
    pub description: String,
    /// Where `skill {name}` goes: the announcing runner's `skill` tool. `None` for a skill the
    /// kernel loads in-process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route: Option<RunnerRoute>,
    /// The effect profile that runner announced for `skill`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effect_profile: Option<Value>,
    /// The `timeout_ms` that runner announced for `skill`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// The memory binding whose `skills/<name>.md` holds it, for a skill the kernel loads
    /// in-process (`docs/kernel-tools.md`, "skill").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<crate::memory::MemoryScope>,
}

/// What a runner looked like when it was selected: its id, display name, status and canonical
/// announcement.
#[derive(Clone, Debug, PartialEq)]
pub struct RunnerFacts {
    /// The runner's UUID.
    pub public_id: RunnerId,
    /// Display name.
    pub display_name: String,
    /// Whether it may serve the answering Agent ([`crate::eligibility`]).
    pub eligibility: Eligibility,
    /// The canonical announcement `{tools, environment, documents}`.
    pub announcement: Value,
}

impl RunnerFacts {
    /// Whether the runner may serve the answering Agent.
    pub fn eligible(&self) -> bool {
        self.eligibility == Eligibility::Eligible
    }
}

/// Whether a runner may serve a principal (`docs/protocol.md`, "Assignment"): one rule, judged
/// by [`crate::eligibility::judge`]. Presence never enters it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Eligibility {
    /// Active, and account-wide or assigned to the principal.
    Eligible,
    /// Account-wide or assigned to the principal, but revoked: it serves no one again.
    Revoked,
    /// Assigned to other Agents only. The principal is told what it would be told of a runner
    /// that does not exist: neither its display name nor its Agents leak.
    NotAssigned,
}

/// The immutable declaration an execution runs under (`docs/declaration.md`, "Freezing").
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FrozenDeclaration {
    /// The assembled tool set, in declaration order.
    pub tools: Vec<FrozenTool>,
    /// `bypass | ask | rules`, or null when nothing needs approval.
    pub approval_mode: Option<String>,
    /// As declared.
    pub approval_rules: Value,
    /// The model reference every round uses.
    pub default_model: Option<String>,
    /// Captured fallback list.
    pub fallback_models: Vec<String>,
    /// The system prompt document, if any.
    pub system_prompt: Option<Value>,
    /// The selected Runner (`default_runner_executor_public_id`).
    pub default_runner_executor_public_id: Option<RunnerId>,
    /// The candidates with their display names and environments, in declaration order.
    pub runner_candidates: Vec<Value>,
    /// As declared; run by a later part of the fabric.
    pub lifecycle_hooks: Value,
    /// `compaction_policy` as declared (`docs/declaration.md`, "Compaction policy"), or null;
    /// run by [`crate::actors::execution::compaction`]. Absent in declarations frozen before it
    /// was captured.
    #[serde(default)]
    pub compaction_policy: Value,
    /// The `summarizer` prompt document `{content, role}`, if any: the kernel summarizer's
    /// instructions. Absent in declarations frozen before it was captured.
    #[serde(default)]
    pub summarizer: Option<Value>,
    /// `prompt_mechanism` as declared; absent means `default` (`docs/prompt.md`, "The
    /// prompt as declared").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_mechanism: Option<Mechanism>,
    /// `prompt_template` as declared, read under `assembly` only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_template: Option<Value>,
    /// The profile's `system_prompt` version frozen here; absent for an inline declaration's
    /// document (and for declarations frozen before it was captured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_prompt_version: Option<i64>,
    /// The skills the execution may load, when `skill` is declared ([`FrozenSkill`]); absent in
    /// declarations frozen before skills were captured, and when there are none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skills: Vec<FrozenSkill>,
    /// The effective memory bindings (selected roots ∩ `memory_context_limit`, R36) with their
    /// owners resolved, frozen at materialization (R38; `docs/kernel-tools.md`, "memory"). Empty:
    /// no memory (and in declarations frozen before it was captured).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub memory_bindings: Vec<crate::memory::MemoryBinding>,
    /// `conversation_reach` captured at materialization (R37, R38): a later profile edit does not
    /// change it, and a regeneration that reuses the declaration keeps it. Absent in declarations
    /// frozen before it was captured: `workspace`, what null means.
    #[serde(default)]
    pub conversation_reach: ConversationReach,
    /// `delegation_catalog` as declared (null, or the array of entries `{name, description,
    /// model_mode, declaration}`), captured at materialization so catalog edits affect only future
    /// parents (R52; `docs/delegation.md`, "spawn"). Absent in declarations frozen before it was
    /// captured: null.
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub delegation_catalog: Value,
    /// Digest of this declaration's canonical JSON (without this field), for display.
    pub digest: String,
}

impl FrozenDeclaration {
    /// The declaration with its `summarizer` document frozen beside it, and its digest taken
    /// again over the whole.
    #[must_use]
    pub fn with_summarizer(mut self, summarizer: Option<Value>) -> Self {
        self.summarizer = summarizer;
        self.redigest()
    }

    /// The declaration with the profile's `system_prompt` version frozen beside it, and its
    /// digest taken again over the whole.
    #[must_use]
    pub fn with_system_prompt_version(mut self, version: Option<i64>) -> Self {
        self.system_prompt_version = version;
        self.redigest()
    }

    /// Whether `skill` (`nexus.skill.load`) is in the frozen tool set, under any spelling.
    #[must_use]
    pub fn declares_skill(&self) -> bool {
        self.tools.iter().any(|tool| tool.canonical_name() == Some(SKILL_CANONICAL))
    }

    /// The declaration with its effective memory bindings frozen beside it, and its digest taken
    /// again over the whole.
    #[must_use]
    pub fn with_memory_bindings(mut self, bindings: Vec<crate::memory::MemoryBinding>) -> Self {
        self.memory_bindings = bindings;
        self.redigest()
    }

    /// The frozen binding of `scope`, if the effective context holds it.
    #[must_use]
    pub fn memory_binding(&self, scope: crate::memory::MemoryScope) -> Option<&crate::memory::MemoryBinding> {
        self.memory_bindings.iter().find(|b| b.scope == scope)
    }

    /// The mechanism the execution's requests are assembled by.
    #[must_use]
    pub fn mechanism(&self) -> Mechanism {
        self.prompt_mechanism.unwrap_or(Mechanism::Default)
    }

    /// The declaration with its digest taken again over the whole, after a change made in place.
    #[must_use]
    pub fn redigested(self) -> Self {
        self.redigest()
    }

    fn redigest(mut self) -> Self {
        self.digest = String::new();
        let bytes = serde_json::to_vec(&self).unwrap_or_default();
        self.digest = hex::encode(Sha256::digest(&bytes));
        self
    }
}

/// Builds the qualified collision name: the first 49 characters of the served name, `__`, then 12
/// hex characters of SHA-256 over (runner UUID, NUL, served name) (`docs/declaration.md`,
/// "Collision names"). At most 63 characters.
///
/// A character of the head outside `[a-zA-Z0-9_-]` is written as `_`, so the name always fits the
/// provider rule `^[a-zA-Z0-9_-]{1,64}$`; for a served name inside that rule the name is exactly
/// the spec's. The digest covers the full served name as announced.
pub fn qualified_name(runner: RunnerId, served: &str) -> String {
    let mut hasher = Sha256::new();
    hasher.update(runner.to_string().as_bytes());
    hasher.update([0u8]);
    hasher.update(served.as_bytes());
    let digest = hex::encode(hasher.finalize());
    let head: String = served
        .chars()
        .take(49)
        .map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '_' })
        .collect();
    format!("{head}__{}", &digest[..12])
}
