//! The catalog: every tool this runner serves now, built-ins, command tools and the tools fed in
//! from outside (an MCP hub's), each with its announcement entry, its concurrency bound and what
//! serves it. The announcement is made from it, calls are routed by it, and claims are bounded
//! by it (`docs/runner-tools.md`, "Concurrency per tool").
//!
//! A catalog is immutable; a change (a reloaded tools file, new MCP tools) builds a new one,
//! checked whole: every name within the provider rule and unique, and the tool list within
//! nexus's bound on an announcement.

use std::collections::HashMap;
use std::fmt;
use std::num::NonZeroUsize;
use std::sync::Arc;

use futures::future::BoxFuture;
use serde_json::{Value, json};

use super::{Builtin, EffectProfile, ToolContext, ToolOutcome};
use crate::toolsfile::{CommandTool, MAX_TOOL_NAME_CHARS};

/// nexus's bound on an announcement's tool list, in bytes of its JSON (`docs/protocol.md`,
/// "Announce": 1,048,576 bytes of canonical JSON; key order does not change the length).
pub(crate) const MAX_TOOL_LIST_BYTES: usize = 1_048_576;

/// One tool as announced, with the runner-side bound on its concurrent calls.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ToolSpec {
    /// `^[a-zA-Z0-9_-]{1,64}$`, unique in the catalog.
    pub(crate) name: String,
    /// What the model reads; `None` with `input_schema` `None` keeps the tool from models
    /// (`skill`).
    pub(crate) description: Option<String>,
    /// A JSON object with `"type": "object"`, or `None`.
    pub(crate) input_schema: Option<Value>,
    /// The five-key profile nexus freezes into executions.
    pub(crate) effect_profile: EffectProfile,
    /// The announced `timeout_ms`, 1..=604800000.
    pub(crate) timeout_ms: u64,
    /// At most this many calls claimed or running at once; `None`: only the slots bound. Not
    /// announced: it is the runner's own business.
    pub(crate) max_concurrency: Option<NonZeroUsize>,
}

impl ToolSpec {
    /// The entry of the announce frame's `tools`: `{name, description?, input_schema?,
    /// effect_profile, timeout_ms}`.
    pub(crate) fn announced(&self) -> Value {
        let mut entry = json!({
            "name": self.name,
            "effect_profile": self.effect_profile,
            "timeout_ms": self.timeout_ms,
        });
        if let Some(description) = &self.description {
            entry["description"] = json!(description);
        }
        if let Some(schema) = &self.input_schema {
            entry["input_schema"] = schema.clone();
        }
        entry
    }

    /// The entry `runner-agent tools` prints: `{name, timeout_ms, max_concurrency (null for no
    /// bound), effect_profile, description (null when absent)}`.
    pub(crate) fn described(&self) -> Value {
        json!({
            "name": self.name,
            "timeout_ms": self.timeout_ms,
            "max_concurrency": self.max_concurrency,
            "effect_profile": self.effect_profile,
            "description": self.description,
        })
    }
}

/// How a tool fed in from outside is called: the call's `tool_input` and its context, to the
/// outcome. Bounded by its caller's own timeout; the context's stop must end it.
pub(crate) type ExtraCall = Arc<dyn Fn(Value, ToolContext) -> BoxFuture<'static, ToolOutcome> + Send + Sync>;

/// A tool this module does not serve itself (an MCP server's, through the hub): its entry and
/// the way to call it. See [`super::Toolbox::set_extra_tools`].
#[derive(Clone)]
pub(crate) struct ExtraTool {
    /// Its announcement entry.
    pub(crate) spec: ToolSpec,
    /// Runs one call.
    pub(crate) call: ExtraCall,
}

impl fmt::Debug for ExtraTool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExtraTool").field("spec", &self.spec).finish_non_exhaustive()
    }
}

/// What serves a catalog entry.
#[derive(Clone)]
pub(crate) enum Served {
    /// One of [`Builtin`].
    Builtin(Builtin),
    /// `skill`, reading the skills directory.
    Skill,
    /// A command tool of the tools file.
    Command(Arc<CommandTool>),
    /// A tool fed in from outside.
    Extra(ExtraCall),
}

impl fmt::Debug for Served {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Served::Builtin(builtin) => f.debug_tuple("Builtin").field(builtin).finish(),
            Served::Skill => f.write_str("Skill"),
            Served::Command(tool) => f.debug_tuple("Command").field(&tool.name).finish(),
            Served::Extra(_) => f.write_str("Extra"),
        }
    }
}

/// Why a catalog cannot be built.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum CatalogError {
    /// Two tools have the same name.
    #[error("two tools are named `{0}`; every tool name must be unique")]
    Duplicate(String),
    /// A name breaks the provider rule.
    #[error("the tool name {0:?} does not match ^[a-zA-Z0-9_-]{{1,64}}$")]
    InvalidName(String),
    /// The tool list is larger than nexus takes.
    #[error(
        "the tool list would take {0} bytes, more than the {MAX_TOOL_LIST_BYTES} nexus accepts in an announcement; \
         shorten descriptions and schemas or serve fewer tools"
    )]
    TooLarge(usize),
}

/// Every tool served now, in announcement order.
#[derive(Debug, Default)]
pub(crate) struct Catalog {
    tools: Vec<(ToolSpec, Served)>,
    index: HashMap<String, usize>,
}

impl Catalog {
    /// The catalog of `tools`, in order.
    ///
    /// # Errors
    /// [`CatalogError`] for a name outside the provider rule, a name twice, or a tool list
    /// beyond [`MAX_TOOL_LIST_BYTES`].
    pub(crate) fn new(tools: Vec<(ToolSpec, Served)>) -> Result<Catalog, CatalogError> {
        let mut index = HashMap::with_capacity(tools.len());
        let mut bytes = 2; // the list's brackets
        for (position, (spec, _)) in tools.iter().enumerate() {
            let name = &spec.name;
            let valid = !name.is_empty()
                && name.chars().count() <= MAX_TOOL_NAME_CHARS
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
            if !valid {
                return Err(CatalogError::InvalidName(name.clone()));
            }
            if index.insert(name.clone(), position).is_some() {
                return Err(CatalogError::Duplicate(name.clone()));
            }
            bytes += serde_json::to_string(&spec.announced()).map_or(usize::MAX / 2, |text| text.len()) + 1;
        }
        let bytes = bytes.saturating_sub(usize::from(!tools.is_empty()));
        if bytes > MAX_TOOL_LIST_BYTES {
            return Err(CatalogError::TooLarge(bytes));
        }
        Ok(Catalog { tools, index })
    }

    /// The entry named `name`.
    pub(crate) fn get(&self, name: &str) -> Option<&(ToolSpec, Served)> {
        self.index.get(name).and_then(|position| self.tools.get(*position))
    }

    /// Every entry, in announcement order.
    pub(crate) fn specs(&self) -> impl Iterator<Item = &ToolSpec> {
        self.tools.iter().map(|(spec, _)| spec)
    }

    /// How many calls of `name` may be claimed or running at once; `None`: no bound of its own
    /// (an unknown name included).
    pub(crate) fn max_concurrency(&self, name: &str) -> Option<NonZeroUsize> {
        self.get(name).and_then(|(spec, _)| spec.max_concurrency)
    }

    /// The announce frame's `tools`.
    pub(crate) fn announced_tools(&self) -> Vec<Value> {
        self.specs().map(ToolSpec::announced).collect()
    }

    /// The names served, for a message: at most `limit`, then how many more.
    pub(crate) fn names_for_message(&self, limit: usize) -> String {
        let mut names: Vec<&str> = self.specs().take(limit).map(|spec| spec.name.as_str()).collect();
        let more = self.tools.len().saturating_sub(limit);
        let more = (more > 0).then(|| format!("and {more} more"));
        names.extend(more.as_deref());
        names.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str, description: &str) -> (ToolSpec, Served) {
        let spec = ToolSpec {
            name: name.to_owned(),
            description: Some(description.to_owned()),
            input_schema: Some(json!({"type": "object"})),
            effect_profile: EffectProfile::UNKNOWN_WRITE,
            timeout_ms: 1_000,
            max_concurrency: NonZeroUsize::new(2),
        };
        (spec, Served::Builtin(Builtin::Bash))
    }

    #[test]
    fn a_catalog_refuses_duplicates_bad_names_and_a_list_over_the_bound() {
        let catalog = Catalog::new(vec![spec("a", "x"), spec("b", "y")]).unwrap();
        assert_eq!(catalog.max_concurrency("a"), NonZeroUsize::new(2));
        assert_eq!(catalog.max_concurrency("nope"), None);
        assert_eq!(catalog.names_for_message(1), "a, and 1 more");
        let announced = catalog.announced_tools();
        assert!(announced[0].get("max_concurrency").is_none(), "the bound stays with the runner");
        assert_eq!(announced[1]["name"], "b");

        assert_eq!(
            Catalog::new(vec![spec("a", "x"), spec("a", "y")]).unwrap_err(),
            CatalogError::Duplicate("a".into())
        );
        assert!(matches!(Catalog::new(vec![spec("a.b", "x")]), Err(CatalogError::InvalidName(_))));
        assert!(matches!(Catalog::new(vec![spec(&"n".repeat(65), "x")]), Err(CatalogError::InvalidName(_))));

        // The bound is on the list's JSON: find the description length that lands exactly on it.
        let one = |len: usize| Catalog::new(vec![spec("a", &"d".repeat(len))]);
        let overhead = serde_json::to_string(&vec![spec("a", "").0.announced()]).unwrap().len();
        assert!(one(MAX_TOOL_LIST_BYTES - overhead).is_ok());
        assert_eq!(
            one(MAX_TOOL_LIST_BYTES - overhead + 1).unwrap_err(),
            CatalogError::TooLarge(MAX_TOOL_LIST_BYTES + 1)
        );
    }
}
