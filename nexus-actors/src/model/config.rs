//! The provider table: which `provider/model` references exist and how to reach them.
//!
//! # TOML shape
//!
//! [`ProviderTable`] is `serde(transparent)` over a map from provider name to
//! [`ProviderConfig`], so inside the nexus config file it is one `[providers.<name>]` table per
//! provider:
//!
//! ```toml
//! [providers.scripted]
//! kind = "scripted"
//!
//! [providers.scripted.models.default]            # scripted/default, no script
//! [providers.scripted.models.quickstart]         # scripted/quickstart
//! script = "deploy/quickstart/script.json"
//!
//! [providers.openrouter]
//! kind = "openai_compatible"
//! base_url = "https://openrouter.ai/api/v1"
//! api_key_env = "OPENROUTER_API_KEY"
//! allow_any_model = true                          # openrouter/z-ai/glm-5.3 and any other name
//! request_timeout_ms = 120000
//!
//! [providers.local]
//! kind = "openai_compatible"
//! base_url = "http://127.0.0.1:11434/v1"          # Ollama; no api_key_env: no Authorization header
//! context_window_tokens = 32768                   # tokens; compaction measures requests against it
//! models = { "qwen3:8b" = {}, "llama3.1:8b" = { hidden = true, context_window_tokens = 8192 } }
//!
//! [providers.anthropic]
//! kind = "anthropic"                              # POST {base_url}/v1/messages
//! api_key_env = "ANTHROPIC_API_KEY"               # required: sent as x-api-key
//! allow_any_model = true                          # anthropic/claude-sonnet-4-5 and any other name
//! max_tokens = 8192                               # the API requires one; this is the default
//! ```
//!
//! A table that is present replaces the built-in one ([`ProviderTable::default`]) whole; nothing
//! merges implicitly. A config struct should mark its `providers` field `#[serde(default)]` so
//! an omitted table means the built-in one, and may call [`ProviderTable::with_builtin`] to add
//! the built-in providers under the names the file does not define.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Name of the built-in deterministic provider.
pub const SCRIPTED_PROVIDER: &str = "scripted";
/// Name of the built-in OpenRouter provider.
pub const OPENROUTER_PROVIDER: &str = "openrouter";
/// Default for [`ProviderConfig::request_timeout_ms`]: 120 000 ms (two minutes).
pub const DEFAULT_REQUEST_TIMEOUT_MS: u64 = 120_000;
/// The context window of a model whose provider and model entries name none, in tokens
/// (128 000). Compaction measures a request against it (`docs/executions.md`, "Compaction").
pub const DEFAULT_CONTEXT_WINDOW_TOKENS: u64 = 128_000;

/// The provider table from the nexus config: provider name -> provider.
///
/// Serialized transparently as the map itself (see the module docs for the TOML shape).
/// Provider names are non-empty and contain no `/` and no whitespace; [`super::ModelRegistry::new`]
/// refuses other names.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(transparent)]
pub struct ProviderTable {
    /// Provider name -> configuration. The name is the part of a reference before the first `/`.
    pub providers: BTreeMap<String, ProviderConfig>,
}

impl Default for ProviderTable {
    /// The built-in table:
    /// - `scripted`: kind `scripted`, one model `default` with no script (answers
    ///   `scripted/default has no script; input was: <input>`);
    /// - `openrouter`: kind `openai_compatible`, base URL `https://openrouter.ai/api/v1`, key from
    ///   `OPENROUTER_API_KEY`, any model name allowed.
    fn default() -> Self {
        let scripted = ProviderConfig {
            models: BTreeMap::from([("default".to_owned(), ModelConfig::default())]),
            ..ProviderConfig::new(ProviderKind::Scripted)
        };
        let openrouter = ProviderConfig {
            base_url: Some("https://openrouter.ai/api/v1".to_owned()),
            api_key_env: Some("OPENROUTER_API_KEY".to_owned()),
            allow_any_model: true,
            ..ProviderConfig::new(ProviderKind::OpenAiCompatible)
        };
        Self {
            providers: BTreeMap::from([
                (SCRIPTED_PROVIDER.to_owned(), scripted),
                (OPENROUTER_PROVIDER.to_owned(), openrouter),
            ]),
        }
    }
}

impl ProviderTable {
    /// Adds each built-in provider whose name this table does not define; a provider the table
    /// defines is kept exactly as written.
    #[must_use]
    pub fn with_builtin(mut self) -> Self {
        for (name, config) in Self::default().providers {
            self.providers.entry(name).or_insert(config);
        }
        self
    }
}

/// Default `base_url` of an `anthropic` provider.
pub const ANTHROPIC_BASE_URL: &str = "https://api.anthropic.com";

/// How nexus talks to a provider.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
pub enum ProviderKind {
    /// `scripted`: the deterministic in-process provider (see [`super::scripted`]); no I/O.
    #[serde(rename = "scripted")]
    Scripted,
    /// `openai_compatible`: `POST {base_url}/chat/completions` (OpenRouter, vLLM, llama.cpp
    /// server, Ollama, OpenAI); see [`super::openai`].
    #[serde(rename = "openai_compatible")]
    OpenAiCompatible,
    /// `anthropic`: `POST {base_url}/v1/messages` (the Anthropic Messages API); see
    /// [`super::anthropic`].
    #[serde(rename = "anthropic")]
    Anthropic,
}

/// One provider of the table (`[providers.<name>]`).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ProviderConfig {
    /// `kind`: `scripted`, `openai_compatible` or `anthropic`. Required.
    pub kind: ProviderKind,
    /// `enabled`: a disabled provider resolves to `provider_disabled`. Default `true`.
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// `base_url`: the API root (a trailing `/` is ignored). `openai_compatible`: required, e.g.
    /// `https://openrouter.ai/api/v1`; requests go to `{base_url}/chat/completions`.
    /// `anthropic`: default [`ANTHROPIC_BASE_URL`]; requests go to `{base_url}/v1/messages` (a
    /// `base_url` ending in `/v1` is accepted too). Refused for `scripted`. Default none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
    /// `api_key_env`: the name of the environment variable holding the API key, sent as
    /// `Authorization: Bearer <key>` (`openai_compatible`) or `x-api-key: <key>` (`anthropic`).
    /// When set and the variable is unset or empty, every model of the provider resolves to
    /// `missing_credential`. `openai_compatible`: optional, absent sends no `Authorization`
    /// header (local servers). `anthropic`: required. Refused for `scripted`. Default none. The
    /// key itself is never written in config.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
    /// `models`: model name (the part after the first `/`, may itself contain `/`) -> options.
    /// Default empty.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub models: BTreeMap<String, ModelConfig>,
    /// `allow_any_model`: when `true`, a model name absent from `models` resolves (as visible);
    /// when `false` it is `unknown_model`. Default `false`.
    #[serde(default)]
    pub allow_any_model: bool,
    /// `request_timeout_ms`: the whole-request timeout of one provider call, in milliseconds
    /// (connect, send and reading the full answer). Must be > 0. Default 120 000 (two minutes).
    /// Unused by `scripted`.
    #[serde(default = "default_request_timeout_ms")]
    pub request_timeout_ms: u64,
    /// `stream`: ask for a streamed answer (server-sent events), so an execution publishes the
    /// answer's transcript deltas as it arrives; `false` asks for whole answers (for a server
    /// whose streaming is broken). The final answer is the same either way, and a server that
    /// answers a stream request with a whole answer is accepted. Default `true`. Unused by
    /// `scripted`.
    #[serde(default = "default_true")]
    pub stream: bool,
    /// `max_tokens`: the most output tokens of one call, > 0. `openai_compatible`: sent as
    /// `max_tokens` when set, default not sent (the server's own limit). `anthropic`: default
    /// 8192 (the API requires a value). Refused for `scripted`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// `anthropic_version`: `anthropic` only, the `anthropic-version` header. Default
    /// `2023-06-01`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub anthropic_version: Option<String>,
    /// `context_window_tokens`: the context window of this provider's models, in tokens (> 0),
    /// unless a model's own entry names one. Compaction measures each request against it
    /// (`docs/executions.md`, "Compaction": `usage` and `wall` triggers). Default
    /// [`DEFAULT_CONTEXT_WINDOW_TOKENS`] (128 000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_window_tokens: Option<u64>,
    /// `input_price_per_mtok`: what the provider charges per million input tokens, in USD
    /// (finite, >= 0), unless a model's own entry names a price. Execution budgets price model
    /// calls with it (`docs/executions.md`, "Budgets"). Default none (unpriced: a budget with
    /// `max_cost_usd` refuses a call of an unpriced model).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_price_per_mtok: Option<f64>,
    /// `output_price_per_mtok`: what the provider charges per million output tokens, in USD
    /// (finite, >= 0), unless a model's own entry names a price. Default none (unpriced).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_price_per_mtok: Option<f64>,
}

impl ProviderConfig {
    /// A provider of `kind` with every other field at its default.
    #[must_use]
    pub fn new(kind: ProviderKind) -> Self {
        Self {
            kind,
            enabled: true,
            base_url: None,
            api_key_env: None,
            models: BTreeMap::new(),
            allow_any_model: false,
            request_timeout_ms: DEFAULT_REQUEST_TIMEOUT_MS,
            stream: true,
            max_tokens: None,
            anthropic_version: None,
            context_window_tokens: None,
            input_price_per_mtok: None,
            output_price_per_mtok: None,
        }
    }

    /// The prices of `model` (`docs/executions.md`, "Budgets"): each of the input and output
    /// price from the model's entry, else from the provider's; `None` unless both are known.
    #[must_use]
    pub fn prices(&self, model: &str) -> Option<super::ModelPrices> {
        let entry = self.models.get(model);
        let input = entry.and_then(|m| m.input_price_per_mtok).or(self.input_price_per_mtok)?;
        let output = entry.and_then(|m| m.output_price_per_mtok).or(self.output_price_per_mtok)?;
        Some(super::ModelPrices { input_per_mtok: input, output_per_mtok: output })
    }

    /// The most output tokens one call of this provider may answer with, when the adapter sends a
    /// limit: `max_tokens`, or the `anthropic` default ([`super::anthropic::DEFAULT_ANTHROPIC_MAX_TOKENS`]);
    /// `None` for an `openai_compatible` provider without `max_tokens` (the server's own limit)
    /// and for `scripted`.
    #[must_use]
    pub fn output_cap_tokens(&self) -> Option<u64> {
        match self.kind {
            ProviderKind::Anthropic => {
                Some(u64::from(self.max_tokens.unwrap_or(super::anthropic::DEFAULT_ANTHROPIC_MAX_TOKENS)))
            }
            ProviderKind::OpenAiCompatible => self.max_tokens.map(u64::from),
            ProviderKind::Scripted => None,
        }
    }

    /// The context window of `model`, in tokens: the model entry's `context_window_tokens`, else
    /// the provider's, else [`DEFAULT_CONTEXT_WINDOW_TOKENS`].
    #[must_use]
    pub fn context_window_tokens(&self, model: &str) -> u64 {
        self.models
            .get(model)
            .and_then(|m| m.context_window_tokens)
            .or(self.context_window_tokens)
            .unwrap_or(DEFAULT_CONTEXT_WINDOW_TOKENS)
    }
}

/// Options of one model (`[providers.<name>.models.<model>]`).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// `hidden`: a hidden model is listed with `visible: false` and resolves to `model_hidden`.
    /// Default `false`.
    #[serde(default)]
    pub hidden: bool,
    /// `script`: `scripted` providers only; path of a JSON script file (format in
    /// [`super::scripted`]), read once when the registry is built. A relative path in a config
    /// file is relative to that file's directory ([`crate::config::ServerConfig::load`]). Default none (the model answers
    /// `<provider>/<model> has no script; input was: <input>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub script: Option<PathBuf>,
    /// `context_window_tokens`: this model's context window, in tokens (> 0); overrides the
    /// provider's. Default none (the provider's, else [`DEFAULT_CONTEXT_WINDOW_TOKENS`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_window_tokens: Option<u64>,
    /// `input_price_per_mtok`: USD per million input tokens (finite, >= 0); overrides the
    /// provider's. Default none (the provider's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_price_per_mtok: Option<f64>,
    /// `output_price_per_mtok`: USD per million output tokens (finite, >= 0); overrides the
    /// provider's. Default none (the provider's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_price_per_mtok: Option<f64>,
}

fn default_true() -> bool {
    true
}

fn default_request_timeout_ms() -> u64 {
    DEFAULT_REQUEST_TIMEOUT_MS
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Stands for the nexus config file: the table sits under `providers`.
    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct ConfigFile {
        #[serde(default)]
        providers: ProviderTable,
    }

    #[test]
    fn module_doc_example_parses_with_defaults_filled_in() {
        let text = r#"
[providers.scripted]
kind = "scripted"

[providers.scripted.models.default]
[providers.scripted.models.quickstart]
script = "deploy/quickstart/script.json"

[providers.openrouter]
kind = "openai_compatible"
base_url = "https://openrouter.ai/api/v1"
api_key_env = "OPENROUTER_API_KEY"
allow_any_model = true
request_timeout_ms = 120000

[providers.local]
kind = "openai_compatible"
base_url = "http://127.0.0.1:11434/v1"
context_window_tokens = 32768
models = { "qwen3:8b" = {}, "llama3.1:8b" = { hidden = true, context_window_tokens = 8192 } }

[providers.anthropic]
kind = "anthropic"
api_key_env = "ANTHROPIC_API_KEY"
allow_any_model = true
max_tokens = 8192
"#;
        let file: ConfigFile = toml::from_str(text).expect("example parses");
        let table = file.providers;
        assert_eq!(table.providers.len(), 4);
        let anthropic = &table.providers["anthropic"];
        assert_eq!(anthropic.kind, ProviderKind::Anthropic);
        assert_eq!(anthropic.base_url, None, "the default base_url applies at build time");
        assert_eq!(anthropic.max_tokens, Some(8192));
        assert!(anthropic.stream);
        assert_eq!(anthropic.anthropic_version, None);

        let scripted = &table.providers["scripted"];
        assert_eq!(scripted.kind, ProviderKind::Scripted);
        assert!(scripted.enabled);
        assert_eq!(scripted.models["default"], ModelConfig::default());
        assert_eq!(scripted.models["quickstart"].script, Some(PathBuf::from("deploy/quickstart/script.json")));

        // The openrouter entry written out equals the built-in one.
        assert_eq!(table.providers["openrouter"], ProviderTable::default().providers["openrouter"]);

        let local = &table.providers["local"];
        assert_eq!(local.kind, ProviderKind::OpenAiCompatible);
        assert_eq!(local.api_key_env, None);
        assert!(!local.allow_any_model);
        assert_eq!(local.request_timeout_ms, DEFAULT_REQUEST_TIMEOUT_MS);
        assert!(local.models["llama3.1:8b"].hidden);
        assert_eq!(local.context_window_tokens("qwen3:8b"), 32_768, "the provider's window");
        assert_eq!(local.context_window_tokens("llama3.1:8b"), 8_192, "the model's own window");
        assert_eq!(scripted.context_window_tokens("default"), DEFAULT_CONTEXT_WINDOW_TOKENS);
        assert!(!local.models["qwen3:8b"].hidden);
    }

    #[test]
    fn omitted_table_is_the_builtin_one_and_round_trips() {
        let file: ConfigFile = toml::from_str("").expect("empty config parses");
        assert_eq!(file.providers, ProviderTable::default());
        let builtin = ProviderTable::default();
        assert_eq!(builtin.providers.keys().collect::<Vec<_>>(), vec!["openrouter", "scripted"]);
        let written = toml::to_string(&builtin).expect("serializes");
        let reread: ProviderTable = toml::from_str(&written).expect("reparses");
        assert_eq!(reread, builtin);
    }

    #[test]
    fn unknown_fields_and_kinds_are_refused() {
        let unknown_field = "[providers.x]\nkind = \"scripted\"\napi_key = \"sk-1\"\n";
        assert!(toml::from_str::<ConfigFile>(unknown_field).is_err());
        let unknown_model_field = "[providers.x]\nkind = \"scripted\"\n[providers.x.models.m]\nvisible = true\n";
        assert!(toml::from_str::<ConfigFile>(unknown_model_field).is_err());
        let unknown_kind = "[providers.x]\nkind = \"anthropic_v0\"\n";
        assert!(toml::from_str::<ConfigFile>(unknown_kind).is_err());
        let missing_kind = "[providers.x]\nenabled = true\n";
        assert!(toml::from_str::<ConfigFile>(missing_kind).is_err());
    }

    #[test]
    fn with_builtin_keeps_written_providers_and_adds_the_rest() {
        let mut written = ProviderTable { providers: BTreeMap::new() };
        written.providers.insert(
            "openrouter".to_owned(),
            ProviderConfig { enabled: false, ..ProviderConfig::new(ProviderKind::OpenAiCompatible) },
        );
        let merged = written.with_builtin();
        assert_eq!(merged.providers.len(), 2);
        assert!(!merged.providers["openrouter"].enabled);
        assert_eq!(merged.providers["openrouter"].base_url, None);
        assert_eq!(merged.providers["scripted"], ProviderTable::default().providers["scripted"]);
    }
}
