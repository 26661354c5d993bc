//! The resolver: `provider/model` reference -> a client, with the spec's resolver words.
//!
//! Built once at start-up from the [`ProviderTable`] (validated here) and an environment lookup
//! (read here, once: a key exported later needs a new registry). Resolution itself does no I/O,
//! so it is safe inside an actor handler and cheap enough to judge availability live
//! (`docs/executions.md`, "Models": an unresolvable route is skipped with no request).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::ModelProvider;
use super::anthropic::{AnthropicProvider, DEFAULT_ANTHROPIC_MAX_TOKENS};
use super::config::{ANTHROPIC_BASE_URL, ProviderConfig, ProviderKind, ProviderTable};
use super::openai::OpenAiCompatibleProvider;
use super::scripted::{Script, ScriptError, ScriptedProvider};

/// The prefix of a model selector, which is never a complete reference (`docs/declaration.md`,
/// "Configuration fields").
const SELECTOR_PREFIX: &str = "model_selector:";

/// Why the provider table was refused by [`ModelRegistry::new`].
#[non_exhaustive]
#[derive(thiserror::Error, Debug)]
pub enum ConfigError {
    /// A provider entry breaks a rule: a provider name that is empty or holds `/` or whitespace,
    /// an empty model name, `base_url` missing (openai_compatible) or not an absolute http(s)
    /// URL, `base_url`/`api_key_env`/`max_tokens` on a scripted provider, `api_key_env` missing
    /// (anthropic) or empty, `anthropic_version` on a provider that is not anthropic, `script`
    /// on a non-scripted model, `max_tokens = 0`, or `request_timeout_ms = 0`. The reason says
    /// what to write instead.
    #[error("provider `{provider}`: {reason}")]
    Invalid {
        /// The provider name as written.
        provider: String,
        /// Which rule.
        reason: String,
    },
    /// A `script` file could not be read.
    #[error("provider `{provider}` model `{model}`: cannot read script {}: {source}", path.display())]
    ScriptUnreadable {
        /// The provider name.
        provider: String,
        /// The model name.
        model: String,
        /// The configured path.
        path: PathBuf,
        /// The I/O failure.
        source: std::io::Error,
    },
    /// A `script` file is not a valid script.
    #[error("provider `{provider}` model `{model}`: invalid script {}: {source}", path.display())]
    ScriptInvalid {
        /// The provider name.
        provider: String,
        /// The model name.
        model: String,
        /// The configured path.
        path: PathBuf,
        /// What is wrong with it.
        source: ScriptError,
    },
    /// The HTTP client (rustls) could not be built.
    #[error("provider `{provider}`: cannot build http client: {source}")]
    HttpClient {
        /// The provider name.
        provider: String,
        /// The builder failure.
        source: reqwest::Error,
    },
}

/// Why a reference does not resolve. [`ResolveError::word`] is the spec's resolver word, carried
/// in a `validation_failed` message for `default_model`/`fallback_models` (`docs/declaration.md`,
/// "Configuration fields").
/// The `Display` text does not repeat the word, so `format!("{}: {error}", error.word())` reads well.
#[non_exhaustive]
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
pub enum ResolveError {
    /// `unknown_model`: not `provider/model` (no `/`, an empty side, whitespace or a control
    /// character), a `model_selector:` selector, or a model the provider does not list while
    /// `allow_any_model` is false.
    #[error("`{reference}` is not a model reference this server knows")]
    UnknownModel {
        /// The reference as given.
        reference: String,
    },
    /// `unknown_provider`: no provider of that name in the table.
    #[error("no provider named `{provider}`")]
    UnknownProvider {
        /// The provider part.
        provider: String,
    },
    /// `provider_disabled`: the provider has `enabled = false`.
    #[error("provider `{provider}` is disabled")]
    ProviderDisabled {
        /// The provider part.
        provider: String,
    },
    /// `model_hidden`: the model is listed with `hidden = true`.
    #[error("`{reference}` is hidden")]
    ModelHidden {
        /// The reference.
        reference: String,
    },
    /// `missing_credential`: the provider's `api_key_env` variable was unset or empty when the
    /// registry was built.
    #[error("provider `{provider}` needs the environment variable {env_var}")]
    MissingCredential {
        /// The provider part.
        provider: String,
        /// The variable name (never its value).
        env_var: String,
    },
}

impl ResolveError {
    /// The resolver word: `unknown_model`, `unknown_provider`, `provider_disabled`,
    /// `model_hidden` or `missing_credential`.
    #[must_use]
    pub fn word(&self) -> &'static str {
        match self {
            Self::UnknownModel { .. } => "unknown_model",
            Self::UnknownProvider { .. } => "unknown_provider",
            Self::ProviderDisabled { .. } => "provider_disabled",
            Self::ModelHidden { .. } => "model_hidden",
            Self::MissingCredential { .. } => "missing_credential",
        }
    }
}

/// A resolved reference: where to send a model call.
#[derive(Clone, Debug)]
pub struct ResolvedModel {
    /// The reference as given, e.g. `openrouter/z-ai/glm-5.3`.
    pub reference: String,
    /// The provider part, e.g. `openrouter`.
    pub provider: String,
    /// The model part (after the first `/`), e.g. `z-ai/glm-5.3`; goes in [`super::ModelRequest::model`].
    pub model: String,
    /// The provider's client, shared by every model of the provider.
    pub client: Arc<dyn ModelProvider>,
    /// The model's context window, in tokens ([`ProviderConfig::context_window_tokens`]).
    pub context_window_tokens: u64,
    /// The model's prices, `None` when unpriced ([`ProviderConfig::prices`]).
    pub prices: Option<ModelPrices>,
    /// The output limit the adapter sends with each call, in tokens
    /// ([`ProviderConfig::output_cap_tokens`]); `None` when it sends none.
    pub output_cap_tokens: Option<u64>,
}

/// What a model's provider charges, in USD per million tokens (`docs/executions.md`, "Budgets").
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ModelPrices {
    /// USD per million input tokens.
    pub input_per_mtok: f64,
    /// USD per million output tokens.
    pub output_per_mtok: f64,
}

impl ModelPrices {
    /// The price of `input_tokens` in and `output_tokens` out, in USD.
    #[must_use]
    pub fn cost_usd(&self, input_tokens: u64, output_tokens: u64) -> f64 {
        // Token counts stay far below 2^53, where f64 is exact.
        let (input, output) = (input_tokens as f64, output_tokens as f64);
        (input * self.input_per_mtok + output * self.output_per_mtok) / 1_000_000.0
    }
}

#[derive(Clone, Debug)]
struct ProviderEntry {
    /// `Some(variable)` when `api_key_env` names a variable that was unset or empty.
    missing_credential: Option<String>,
    /// Scripted providers only: model -> script.
    scripts: BTreeMap<String, Arc<Script>>,
    client: Arc<dyn ModelProvider>,
}

/// The provider table made usable: validated config, one client per provider, credentials read.
///
/// Resolution order: reference shape, provider exists, provider enabled, credential present,
/// model listed (or `allow_any_model`) and not hidden. Cloning is cheap (clients are shared).
#[derive(Clone, Debug)]
pub struct ModelRegistry {
    table: ProviderTable,
    entries: BTreeMap<String, ProviderEntry>,
}

impl ModelRegistry {
    /// Validates `table`, reads every `script` file, reads each `api_key_env` through `env`
    /// (production passes `|name| std::env::var(name).ok()`), and builds one client per provider.
    /// Blocking file reads: call at start-up, not inside an actor handler.
    pub fn new(table: ProviderTable, env: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let mut entries = BTreeMap::new();
        for (name, config) in &table.providers {
            entries.insert(name.clone(), build_entry(name, config, &env)?);
        }
        Ok(Self { table, entries })
    }

    /// The table this registry was built from (including models defined by [`Self::with_script`]).
    #[must_use]
    pub fn table(&self) -> &ProviderTable {
        &self.table
    }

    /// The declaration-time check of a reference (`docs/declaration.md`, "Configuration fields",
    /// `default_model`): `Ok`, or the resolver's word and a message, as
    /// [`crate::declaration::ModelCheck`] takes it.
    pub fn check(&self, reference: &str) -> Result<(), (String, String)> {
        self.resolve(reference).map(|_| ()).map_err(|e| (e.word().to_owned(), e.to_string()))
    }

    /// Resolves `provider/model`, split at the first `/` (so `openrouter/z-ai/glm-5.3` is provider
    /// `openrouter`, model `z-ai/glm-5.3`). No I/O. Errors carry the resolver words (see
    /// [`ResolveError`]).
    pub fn resolve(&self, reference: &str) -> Result<ResolvedModel, ResolveError> {
        let unknown_model = || ResolveError::UnknownModel { reference: reference.to_owned() };
        if reference.starts_with(SELECTOR_PREFIX) || reference.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(unknown_model());
        }
        let Some((provider, model)) = reference.split_once('/') else {
            return Err(unknown_model());
        };
        if provider.is_empty() || model.is_empty() {
            return Err(unknown_model());
        }
        let (Some(config), Some(entry)) = (self.table.providers.get(provider), self.entries.get(provider)) else {
            return Err(ResolveError::UnknownProvider { provider: provider.to_owned() });
        };
        if !config.enabled {
            return Err(ResolveError::ProviderDisabled { provider: provider.to_owned() });
        }
        if let Some(env_var) = &entry.missing_credential {
            return Err(ResolveError::MissingCredential { provider: provider.to_owned(), env_var: env_var.clone() });
        }
        match config.models.get(model) {
            Some(model_config) if model_config.hidden => {
                return Err(ResolveError::ModelHidden { reference: reference.to_owned() });
            }
            Some(_) => {}
            None if config.allow_any_model => {}
            None => return Err(unknown_model()),
        }
        Ok(ResolvedModel {
            reference: reference.to_owned(),
            provider: provider.to_owned(),
            model: model.to_owned(),
            client: Arc::clone(&entry.client),
            context_window_tokens: config.context_window_tokens(model),
            prices: config.prices(model),
            output_cap_tokens: config.output_cap_tokens(),
        })
    }

    /// Rows for `GET /agent_api/v1/models` (`docs/declaration.md`, "Doors"), one per model listed
    /// in the table, ordered by provider then model: `{"ref", "provider", "visible", "available",
    /// "unavailable_reason"}`. `visible` is `!hidden`; `available` is whether [`Self::resolve`]
    /// succeeds, and `unavailable_reason` is its word when not (`provider_disabled`,
    /// `missing_credential`, `model_hidden`), else `null`. Names reachable only through
    /// `allow_any_model` are not listed.
    #[must_use]
    pub fn list(&self) -> Vec<serde_json::Value> {
        let mut rows = Vec::new();
        for (provider, config) in &self.table.providers {
            for (model, model_config) in &config.models {
                let reference = format!("{provider}/{model}");
                let reason = self.resolve(&reference).err().map(|error| error.word());
                rows.push(serde_json::json!({
                    "ref": reference,
                    "provider": provider,
                    "visible": !model_config.hidden,
                    "available": reason.is_none(),
                    "unavailable_reason": reason,
                }));
            }
        }
        rows
    }

    /// Replaces or defines the script of `provider/model` at runtime (used by `nexus quickstart`).
    /// A model not yet in the table is added to it (visible). Has no effect, apart from a warning
    /// in the log, when `provider` is not a configured `scripted` provider.
    #[must_use]
    pub fn with_script(mut self, provider: &str, model: &str, script: Script) -> Self {
        let (Some(config), Some(entry)) = (self.table.providers.get_mut(provider), self.entries.get_mut(provider))
        else {
            tracing::warn!(provider, model, "with_script: no such provider; script ignored");
            return self;
        };
        if config.kind != ProviderKind::Scripted {
            tracing::warn!(provider, model, "with_script: provider is not scripted; script ignored");
            return self;
        }
        config.models.entry(model.to_owned()).or_default();
        entry.scripts.insert(model.to_owned(), Arc::new(script));
        entry.client = Arc::new(ScriptedProvider::new(provider, entry.scripts.clone()));
        self
    }
}

fn build_entry(
    name: &str,
    config: &ProviderConfig,
    env: &impl Fn(&str) -> Option<String>,
) -> Result<ProviderEntry, ConfigError> {
    let invalid = |reason: &str| ConfigError::Invalid { provider: name.to_owned(), reason: reason.to_owned() };
    if name.is_empty() || name.contains('/') || name.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(invalid("a provider name must be non-empty, without `/` or whitespace"));
    }
    if config.models.keys().any(|model| model.is_empty() || model.chars().any(|c| c.is_whitespace() || c.is_control()))
    {
        return Err(invalid("a model name must be non-empty, without whitespace"));
    }
    if config.request_timeout_ms == 0 {
        return Err(invalid("request_timeout_ms must be > 0 (milliseconds; omit it for 120000)"));
    }
    if config.api_key_env.as_deref().is_some_and(str::is_empty) {
        return Err(invalid("api_key_env must name a variable, e.g. api_key_env = \"OPENROUTER_API_KEY\""));
    }
    if config.max_tokens == Some(0) {
        return Err(invalid("max_tokens must be > 0 (output tokens; omit it for the default)"));
    }
    if config.context_window_tokens == Some(0) || config.models.values().any(|m| m.context_window_tokens == Some(0)) {
        return Err(invalid("context_window_tokens must be > 0 (tokens; omit it for 128000)"));
    }
    let price_ok = |price: Option<f64>| price.is_none_or(|p| p.is_finite() && p >= 0.0);
    if !price_ok(config.input_price_per_mtok)
        || !price_ok(config.output_price_per_mtok)
        || config.models.values().any(|m| !price_ok(m.input_price_per_mtok) || !price_ok(m.output_price_per_mtok))
    {
        return Err(invalid(
            "input_price_per_mtok and output_price_per_mtok must be finite numbers >= 0 (USD per million tokens)",
        ));
    }
    if config.anthropic_version.is_some() && config.kind != ProviderKind::Anthropic {
        return Err(invalid("anthropic_version is for kind = \"anthropic\" only; remove it"));
    }
    if config.kind != ProviderKind::Scripted && config.models.values().any(|model_config| model_config.script.is_some())
    {
        return Err(invalid("`script` is for scripted providers only"));
    }
    let timeout = Duration::from_millis(config.request_timeout_ms);
    // The key is read once, here; a blank variable counts as unset.
    let api_key =
        config.api_key_env.as_deref().and_then(env).map(|key| key.trim().to_owned()).filter(|key| !key.is_empty());
    let missing_credential = match (&config.api_key_env, &api_key) {
        (Some(variable), None) => Some(variable.clone()),
        _ => None,
    };
    match config.kind {
        ProviderKind::Scripted => {
            if config.base_url.is_some() || config.api_key_env.is_some() || config.max_tokens.is_some() {
                return Err(invalid("a scripted provider takes no base_url, api_key_env or max_tokens; remove them"));
            }
            let mut scripts = BTreeMap::new();
            for (model, model_config) in &config.models {
                let Some(path) = &model_config.script else {
                    continue;
                };
                let text = std::fs::read_to_string(path).map_err(|source| ConfigError::ScriptUnreadable {
                    provider: name.to_owned(),
                    model: model.clone(),
                    path: path.clone(),
                    source,
                })?;
                let script = Script::from_json(&text).map_err(|source| ConfigError::ScriptInvalid {
                    provider: name.to_owned(),
                    model: model.clone(),
                    path: path.clone(),
                    source,
                })?;
                scripts.insert(model.clone(), Arc::new(script));
            }
            let client = Arc::new(ScriptedProvider::new(name, scripts.clone()));
            Ok(ProviderEntry { missing_credential: None, scripts, client })
        }
        ProviderKind::OpenAiCompatible => {
            let Some(base_url) = &config.base_url else {
                return Err(invalid(
                    "an openai_compatible provider needs base_url, the API root before /chat/completions, \
                     e.g. base_url = \"http://127.0.0.1:11434/v1\"",
                ));
            };
            let client = OpenAiCompatibleProvider::new(name, base_url, api_key, timeout)?
                .with_stream(config.stream)
                .with_max_tokens(config.max_tokens);
            Ok(ProviderEntry { missing_credential, scripts: BTreeMap::new(), client: Arc::new(client) })
        }
        ProviderKind::Anthropic => {
            if config.api_key_env.is_none() {
                return Err(invalid(
                    "an anthropic provider needs api_key_env, the variable holding the key sent as x-api-key, \
                     e.g. api_key_env = \"ANTHROPIC_API_KEY\"",
                ));
            }
            if config.anthropic_version.as_deref().is_some_and(|v| v.trim().is_empty()) {
                return Err(invalid("anthropic_version must not be empty; omit it for 2023-06-01"));
            }
            let base_url = config.base_url.as_deref().unwrap_or(ANTHROPIC_BASE_URL);
            let mut client = AnthropicProvider::new(name, base_url, api_key, timeout)?
                .with_stream(config.stream)
                .with_max_tokens(config.max_tokens.unwrap_or(DEFAULT_ANTHROPIC_MAX_TOKENS));
            if let Some(version) = &config.anthropic_version {
                client = client.with_version(version.clone());
            }
            Ok(ProviderEntry { missing_credential, scripts: BTreeMap::new(), client: Arc::new(client) })
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::model::config::ModelConfig;
    use crate::model::{ChatMessage, ModelRequest};

    /// `Ok((provider, model))` or `Err(word)`.
    type Expected = Result<(&'static str, &'static str), &'static str>;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    /// One provider per resolver situation.
    fn table() -> ProviderTable {
        let mut table = ProviderTable::default();
        let providers = &mut table.providers;
        providers.insert(
            "off".into(),
            ProviderConfig {
                enabled: false,
                models: BTreeMap::from([("m".into(), ModelConfig::default())]),
                ..ProviderConfig::new(ProviderKind::Scripted)
            },
        );
        providers.insert(
            "claude".into(),
            ProviderConfig {
                api_key_env: Some("ANTHROPIC_API_KEY".into()),
                allow_any_model: true,
                ..ProviderConfig::new(ProviderKind::Anthropic)
            },
        );
        providers.insert(
            "local".into(),
            ProviderConfig {
                base_url: Some("http://127.0.0.1:9/v1".into()),
                models: BTreeMap::from([
                    ("open".into(), ModelConfig::default()),
                    ("secret".into(), ModelConfig { hidden: true, ..ModelConfig::default() }),
                ]),
                ..ProviderConfig::new(ProviderKind::OpenAiCompatible)
            },
        );
        table
    }

    #[test]
    fn resolver_words_one_row_per_word() {
        let registry = ModelRegistry::new(table(), no_env).expect("valid table");
        let rows: [(&str, &str, Expected); 15] = [
            ("anthropic_without_its_key", "claude/claude-sonnet-4-5", Err("missing_credential")),
            ("listed_model", "scripted/default", Ok(("scripted", "default"))),
            ("listed_model_no_key_needed", "local/open", Ok(("local", "open"))),
            ("bare_word", "default", Err("unknown_model")),
            ("selector", "model_selector:fast", Err("unknown_model")),
            ("selector_with_slash", "model_selector:a/b", Err("unknown_model")),
            ("empty_provider", "/default", Err("unknown_model")),
            ("empty_model", "scripted/", Err("unknown_model")),
            ("whitespace", " scripted/default", Err("unknown_model")),
            ("unlisted_model", "local/other", Err("unknown_model")),
            ("unknown_provider", "nowhere/default", Err("unknown_provider")),
            ("provider_disabled", "off/m", Err("provider_disabled")),
            ("model_hidden", "local/secret", Err("model_hidden")),
            ("missing_credential", "openrouter/z-ai/glm-5.3", Err("missing_credential")),
            ("empty", "", Err("unknown_model")),
        ];
        for (name, reference, expected) in rows {
            match (registry.resolve(reference), expected) {
                (Ok(resolved), Ok((provider, model))) => {
                    assert_eq!(resolved.reference, reference, "{name}");
                    assert_eq!((resolved.provider.as_str(), resolved.model.as_str()), (provider, model), "{name}");
                }
                (Err(error), Err(word)) => assert_eq!(error.word(), word, "{name}"),
                (actual, expected) => panic!("{name}: got {actual:?}, expected {expected:?}"),
            }
        }
    }

    #[test]
    fn an_anthropic_provider_with_its_key_resolves() {
        let registry = ModelRegistry::new(table(), |name| (name == "ANTHROPIC_API_KEY").then(|| "sk-ant-x".to_owned()))
            .expect("valid");
        let resolved = registry.resolve("claude/claude-sonnet-4-5").expect("resolves");
        assert_eq!((resolved.provider.as_str(), resolved.model.as_str()), ("claude", "claude-sonnet-4-5"));
        let debug = format!("{:?}", resolved.client);
        assert!(
            debug.contains("AnthropicProvider") && debug.contains("https://api.anthropic.com/v1/messages"),
            "{debug}"
        );
        assert!(!debug.contains("sk-ant-x"), "the key never shows in Debug");
    }

    #[test]
    fn default_table_and_first_slash_split() {
        let without_key = ModelRegistry::new(ProviderTable::default(), no_env).expect("builtin table");
        let scripted = without_key.resolve("scripted/default").expect("scripted resolves");
        assert_eq!((scripted.provider.as_str(), scripted.model.as_str()), ("scripted", "default"));
        let error = without_key.resolve("openrouter/x").expect_err("no key");
        assert_eq!(error.word(), "missing_credential");
        assert_eq!(
            error,
            ResolveError::MissingCredential { provider: "openrouter".into(), env_var: "OPENROUTER_API_KEY".into() }
        );

        let empty_key = ModelRegistry::new(ProviderTable::default(), |_| Some("  ".into())).expect("builtin table");
        assert_eq!(empty_key.resolve("openrouter/x").expect_err("blank key").word(), "missing_credential");

        let with_key = ModelRegistry::new(ProviderTable::default(), |name| {
            (name == "OPENROUTER_API_KEY").then(|| "sk-or-test".to_owned())
        })
        .expect("builtin table");
        let resolved = with_key.resolve("openrouter/z-ai/glm-5.3").expect("any model with a key");
        assert_eq!(resolved.provider, "openrouter");
        assert_eq!(resolved.model, "z-ai/glm-5.3");
        assert_eq!(resolved.reference, "openrouter/z-ai/glm-5.3");
        assert!(format!("{:?}", resolved.client).contains("openrouter"));
        assert!(!format!("{:?}", resolved.client).contains("sk-or-test"), "the key never shows in Debug");
    }

    #[test]
    fn list_rows_follow_resolution() {
        let registry = ModelRegistry::new(table(), no_env).expect("valid table");
        assert_eq!(
            registry.list(),
            vec![
                json!({"ref": "local/open", "provider": "local", "visible": true, "available": true,
                       "unavailable_reason": null}),
                json!({"ref": "local/secret", "provider": "local", "visible": false, "available": false,
                       "unavailable_reason": "model_hidden"}),
                json!({"ref": "off/m", "provider": "off", "visible": true, "available": false,
                       "unavailable_reason": "provider_disabled"}),
                json!({"ref": "scripted/default", "provider": "scripted", "visible": true, "available": true,
                       "unavailable_reason": null}),
            ]
        );
    }

    #[tokio::test]
    async fn with_script_defines_and_replaces_scripts() {
        let registry = ModelRegistry::new(ProviderTable::default(), no_env).expect("builtin table");
        assert_eq!(registry.resolve("scripted/quickstart").expect_err("not yet").word(), "unknown_model");
        let script = Script::from_json(r#"{"rounds":[{"final":"hi {{input}}"}]}"#).expect("parses");
        let registry = registry
            .with_script("scripted", "quickstart", script.clone())
            .with_script("scripted", "default", script.clone())
            .with_script("openrouter", "x", script)
            .with_script("nowhere", "x", Script::from_json(r#"{"rounds":[{"final":"x"}]}"#).expect("parses"));
        let request = |model: &str| ModelRequest {
            model: model.into(),
            messages: vec![ChatMessage::User { content: "bob".into() }],
            tools: vec![],
            deltas: None,
        };
        for reference in ["scripted/quickstart", "scripted/default"] {
            let resolved = registry.resolve(reference).expect("scripted model");
            let answer = resolved.client.complete(request(&resolved.model)).await.expect("answers");
            assert_eq!(answer.text.as_deref(), Some("hi bob"), "{reference}");
        }
        assert_eq!(registry.table().providers.len(), 2);
        assert_eq!(registry.table().providers["openrouter"], ProviderTable::default().providers["openrouter"]);
        assert!(!registry.table().providers.contains_key("nowhere"));
    }

    #[tokio::test]
    async fn script_files_are_read_at_build_time() {
        let dir = tempfile::tempdir().expect("tempdir");
        let good = dir.path().join("good.json");
        std::fs::write(&good, include_str!("../../../deploy/quickstart/script.json")).expect("write");
        let mut table = ProviderTable::default();
        let scripted = table.providers.get_mut("scripted").expect("builtin scripted");
        scripted.models.insert("count".into(), ModelConfig { script: Some(good), ..ModelConfig::default() });
        let registry = ModelRegistry::new(table.clone(), no_env).expect("script loads");
        let resolved = registry.resolve("scripted/count").expect("resolves");
        let answer = resolved
            .client
            .complete(ModelRequest {
                model: resolved.model.clone(),
                messages: vec![ChatMessage::User { content: "count".into() }],
                tools: vec![],
                deltas: None,
            })
            .await
            .expect("round 0");
        assert_eq!(answer.tool_calls[0].id, "count");

        let bad = dir.path().join("bad.json");
        std::fs::write(&bad, r#"{"rounds":[{"final":"{{nope}}"}]}"#).expect("write");
        let mut bad_table = table.clone();
        bad_table.providers.get_mut("scripted").expect("scripted").models.get_mut("count").expect("count").script =
            Some(bad);
        assert!(matches!(ModelRegistry::new(bad_table, no_env), Err(ConfigError::ScriptInvalid { .. })));

        let mut missing_table = table;
        missing_table.providers.get_mut("scripted").expect("scripted").models.get_mut("count").expect("count").script =
            Some(dir.path().join("absent.json"));
        assert!(matches!(ModelRegistry::new(missing_table, no_env), Err(ConfigError::ScriptUnreadable { .. })));
    }

    #[test]
    fn invalid_tables_are_refused() {
        let openai = || ProviderConfig {
            base_url: Some("http://127.0.0.1:8080/v1".into()),
            ..ProviderConfig::new(ProviderKind::OpenAiCompatible)
        };
        let anthropic = || ProviderConfig {
            api_key_env: Some("ANTHROPIC_API_KEY".into()),
            ..ProviderConfig::new(ProviderKind::Anthropic)
        };
        let rows: Vec<(&str, &str, ProviderConfig)> = vec![
            ("slash_in_name", "a/b", ProviderConfig::new(ProviderKind::Scripted)),
            ("empty_name", "", ProviderConfig::new(ProviderKind::Scripted)),
            ("no_base_url", "p", ProviderConfig::new(ProviderKind::OpenAiCompatible)),
            ("relative_base_url", "p", ProviderConfig { base_url: Some("localhost/v1".into()), ..openai() }),
            ("ftp_base_url", "p", ProviderConfig { base_url: Some("ftp://host/v1".into()), ..openai() }),
            ("zero_timeout", "p", ProviderConfig { request_timeout_ms: 0, ..openai() }),
            ("empty_key_env", "p", ProviderConfig { api_key_env: Some(String::new()), ..openai() }),
            (
                "script_on_http_model",
                "p",
                ProviderConfig {
                    models: BTreeMap::from([(
                        "m".into(),
                        ModelConfig { script: Some("s.json".into()), ..ModelConfig::default() },
                    )]),
                    ..openai()
                },
            ),
            (
                "base_url_on_scripted",
                "p",
                ProviderConfig { base_url: Some("http://x".into()), ..ProviderConfig::new(ProviderKind::Scripted) },
            ),
            (
                "empty_model_name",
                "p",
                ProviderConfig { models: BTreeMap::from([(String::new(), ModelConfig::default())]), ..openai() },
            ),
            ("zero_max_tokens", "p", ProviderConfig { max_tokens: Some(0), ..openai() }),
            ("zero_context_window", "p", ProviderConfig { context_window_tokens: Some(0), ..openai() }),
            (
                "zero_model_context_window",
                "p",
                ProviderConfig {
                    models: BTreeMap::from([(
                        "m".into(),
                        ModelConfig { context_window_tokens: Some(0), ..ModelConfig::default() },
                    )]),
                    ..openai()
                },
            ),
            (
                "anthropic_version_on_openai",
                "p",
                ProviderConfig { anthropic_version: Some("2023-06-01".into()), ..openai() },
            ),
            (
                "max_tokens_on_scripted",
                "p",
                ProviderConfig { max_tokens: Some(10), ..ProviderConfig::new(ProviderKind::Scripted) },
            ),
            ("anthropic_without_key_env", "p", ProviderConfig::new(ProviderKind::Anthropic)),
            (
                "anthropic_bad_base_url",
                "p",
                ProviderConfig { base_url: Some("api.anthropic.com".into()), ..anthropic() },
            ),
            ("anthropic_empty_version", "p", ProviderConfig { anthropic_version: Some(" ".into()), ..anthropic() }),
            ("negative_input_price", "p", ProviderConfig { input_price_per_mtok: Some(-1.0), ..openai() }),
            ("infinite_output_price", "p", ProviderConfig { output_price_per_mtok: Some(f64::INFINITY), ..openai() }),
            (
                "nan_model_price",
                "p",
                ProviderConfig {
                    models: BTreeMap::from([(
                        "m".into(),
                        ModelConfig { input_price_per_mtok: Some(f64::NAN), ..ModelConfig::default() },
                    )]),
                    ..openai()
                },
            ),
        ];
        for (name, provider, config) in rows {
            let table = ProviderTable { providers: BTreeMap::from([(provider.to_owned(), config)]) };
            let result = ModelRegistry::new(table, no_env);
            assert!(
                matches!(&result, Err(ConfigError::Invalid { provider: p, .. }) if p == provider),
                "{name}: {result:?}"
            );
        }
        let fine =
            ProviderTable { providers: BTreeMap::from([("p".to_owned(), openai()), ("a".to_owned(), anthropic())]) };
        assert!(ModelRegistry::new(fine, no_env).is_ok());
    }

    #[test]
    fn context_windows_come_from_the_model_then_the_provider_then_the_default() {
        let mut table = ProviderTable::default();
        table.providers.insert(
            "w".into(),
            ProviderConfig {
                base_url: Some("http://127.0.0.1:9/v1".into()),
                allow_any_model: true,
                context_window_tokens: Some(32_000),
                models: BTreeMap::from([(
                    "small".into(),
                    ModelConfig { context_window_tokens: Some(4_000), ..ModelConfig::default() },
                )]),
                ..ProviderConfig::new(ProviderKind::OpenAiCompatible)
            },
        );
        let registry = ModelRegistry::new(table, no_env).expect("valid");
        let window = |reference: &str| registry.resolve(reference).expect("resolves").context_window_tokens;
        assert_eq!(window("w/small"), 4_000, "the model's own window");
        assert_eq!(window("w/any-other"), 32_000, "the provider's window");
        assert_eq!(window("scripted/default"), crate::model::config::DEFAULT_CONTEXT_WINDOW_TOKENS);
    }

    /// `docs/executions.md`, "Budgets": each price from the model's entry, else the provider's;
    /// priced only when both are known. The output cap is what the adapter sends.
    #[test]
    fn prices_come_from_the_model_then_the_provider() {
        let mut table = ProviderTable::default();
        table.providers.insert(
            "w".into(),
            ProviderConfig {
                base_url: Some("http://127.0.0.1:9/v1".into()),
                allow_any_model: true,
                input_price_per_mtok: Some(3.0),
                max_tokens: Some(512),
                models: BTreeMap::from([
                    ("priced".into(), ModelConfig { output_price_per_mtok: Some(15.0), ..ModelConfig::default() }),
                    (
                        "own".into(),
                        ModelConfig {
                            input_price_per_mtok: Some(1.0),
                            output_price_per_mtok: Some(2.0),
                            ..ModelConfig::default()
                        },
                    ),
                ]),
                ..ProviderConfig::new(ProviderKind::OpenAiCompatible)
            },
        );
        let registry = ModelRegistry::new(table, no_env).expect("valid");
        let prices = |reference: &str| registry.resolve(reference).expect("resolves").prices;
        assert_eq!(prices("w/priced"), Some(ModelPrices { input_per_mtok: 3.0, output_per_mtok: 15.0 }));
        assert_eq!(prices("w/own"), Some(ModelPrices { input_per_mtok: 1.0, output_per_mtok: 2.0 }));
        assert_eq!(prices("w/any-other"), None, "no output price: unpriced");
        assert_eq!(registry.resolve("w/own").expect("resolves").output_cap_tokens, Some(512));
        assert_eq!(registry.resolve("scripted/default").expect("resolves").output_cap_tokens, None);
        let own = prices("w/own").expect("priced");
        assert!((own.cost_usd(1_000_000, 500_000) - 2.0).abs() < 1e-12);
    }
}
