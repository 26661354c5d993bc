//! Property and concurrency tests of the Agent configuration door, over the real HTTP doors.
//!
//! The generators are deterministic: an xorshift64 seeded from `NEXUS_PROP_SEED` (or a fixed
//! default). Every assertion message carries the seed and the iteration, so a failure can be
//! replayed with `NEXUS_PROP_SEED=<seed> cargo test -p nexus-tests --test integration conformance_props`.

use std::collections::{BTreeSet, HashSet};

use serde_json::{Map, Value, json};
use uuid::Uuid;

use nexus_tests::{Answer, Http, Minted, RawRunner, TestServer};

/// The default seed when `NEXUS_PROP_SEED` is not set.
const DEFAULT_SEED: u64 = 0x6e65_7875_735f_7031;

fn seed() -> u64 {
    let seed = std::env::var("NEXUS_PROP_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(DEFAULT_SEED);
    eprintln!("NEXUS_PROP_SEED={seed}");
    seed
}

/// xorshift64: small, deterministic, good enough to spread generated shapes.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// A number in `0..n` (`n > 0`).
    fn below(&mut self, n: usize) -> usize {
        let n64 = u64::try_from(n).expect("n fits");
        usize::try_from(self.next() % n64).expect("below n")
    }

    fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    /// A string of `min..=max` characters drawn from `alphabet`.
    fn word(&mut self, alphabet: &[char], min: usize, max: usize) -> String {
        let len = min + self.below(max - min + 1);
        (0..len).map(|_| *self.pick(alphabet)).collect()
    }
}

fn chars(ranges: &[(char, char)], extra: &str) -> Vec<char> {
    let mut out: Vec<char> = ranges.iter().flat_map(|(a, b)| *a..=*b).collect();
    out.extend(extra.chars());
    out
}

fn lower() -> Vec<char> {
    chars(&[('a', 'z'), ('0', '9')], "_")
}

fn provider_alphabet() -> Vec<char> {
    chars(&[('a', 'z'), ('A', 'Z'), ('0', '9')], "_-")
}

/// Text that exercises JSON escaping and non-ASCII bytes.
fn text_alphabet() -> Vec<char> {
    chars(&[('a', 'z'), ('A', 'Z')], " .,:;\"\\/\n\té→{}[]")
}

/// A server with one Agent and a budget large enough for generated traffic.
struct Door {
    server: TestServer,
    agent: Minted,
    http: Http,
}

async fn door() -> Door {
    let server = TestServer::start_with(&[], |config| {
        config.doors.requests_per_minute = 100_000;
        config.doors.burst = 100_000;
    })
    .await;
    let agent = server.agent("agent").await;
    let http = Http::new(&server.url(), Some(&agent.token));
    Door { server, agent, http }
}

impl Door {
    /// The stored bytes of the profile row (configuration and documents) and their versions.
    async fn stored(&self) -> (String, Value) {
        let row = self.server.store().profile(self.agent.member()).await.expect("store").expect("profile");
        let bytes = row.configuration.as_ref().map(Value::to_string).unwrap_or_default();
        let documents = json!({
            "system_prompt": row.system_prompt, "summarizer": row.summarizer,
            "system_prompt_version": row.system_prompt_version, "summarizer_version": row.summarizer_version,
        });
        (bytes, documents)
    }

    async fn read(&self) -> Value {
        let mut read = self.http.profile().await.body;
        read["measured_at"] = Value::Null;
        read
    }

    /// The kernel catalog: `{canonical_name, name, definition, ...}` per tool.
    async fn catalog(&self) -> Vec<Value> {
        self.http.get("/agent_api/v1/tools").await.body["tools"].as_array().cloned().expect("catalog")
    }

    /// The catalog's declarable tools: without the delegation tools this server does not run
    /// yet (declaring one is refused `kernel_tool_unavailable`, `docs/kernel-tools.md`, "What
    /// runs").
    async fn declarable(&self) -> Vec<Value> {
        let catalog = self.catalog().await;
        catalog
            .into_iter()
            .filter(|t| !NOT_SERVED.contains(&t["canonical_name"].as_str().unwrap_or_default()))
            .collect()
    }
}

/// The catalog's tools that arrive with delegation.
const NOT_SERVED: [&str; 6] = [
    "nexus.graph.delegate_task",
    "nexus.graph.wait",
    "nexus.conversation.spawn",
    "nexus.conversation.send",
    "nexus.conversation.status",
    "nexus.conversation.cancel",
];

fn entry_name(entry: &Value) -> &str {
    entry["function"]["name"].as_str().or_else(|| entry["name"].as_str()).unwrap_or_default()
}

// ---- (a) canonical storage is idempotent --------------------------------------------------------

/// A random JSON-schema-like parameter object.
fn parameters(rng: &mut Rng) -> Value {
    let mut properties = Map::new();
    let mut required = Vec::new();
    for _ in 0..rng.below(4) {
        let name = rng.word(&lower(), 1, 12);
        let schema = match rng.below(4) {
            0 => json!({"type": "string", "description": rng.word(&text_alphabet(), 0, 40)}),
            1 => json!({"type": "integer", "minimum": rng.below(10), "maximum": 10 + rng.below(1000)}),
            2 => json!({"type": "number", "minimum": 0.5, "default": 2.25}),
            _ => json!({"type": "array", "items": {"type": "string"}, "maxItems": rng.below(9) + 1}),
        };
        if rng.chance(50) {
            required.push(json!(name.clone()));
        }
        properties.insert(name, schema);
    }
    let mut schema = json!({"type": "object", "properties": properties});
    if !required.is_empty() {
        schema["required"] = Value::Array(required);
    }
    if rng.chance(30) {
        schema["additionalProperties"] = json!(false);
    }
    schema
}

/// A valid tool list of every entry shape, with unique callable names.
fn valid_tool_list(rng: &mut Rng, catalog: &[Value]) -> Vec<Value> {
    let mut taken = HashSet::new();
    let mut list = Vec::new();
    for _ in 0..1 + rng.below(10) {
        let entry = match rng.below(5) {
            0 | 1 => {
                let name = format!("fn_{}", rng.word(&lower(), 1, 20));
                let description = rng.word(&text_alphabet(), 0, 80);
                let mut entry = if rng.chance(50) {
                    json!({"type": "function", "function": {"name": name, "description": description, "parameters": parameters(rng)}})
                } else {
                    json!({"type": "function", "name": name, "description": description, "parameters": parameters(rng)})
                };
                if rng.chance(25) {
                    entry["strict"] = json!(rng.chance(50));
                }
                entry
            }
            2 => {
                let tool = rng.pick(catalog);
                tool["definition"].clone()
            }
            3 => {
                let tool = rng.pick(catalog);
                let name = format!("A{}", rng.word(&provider_alphabet(), 1, 20));
                let mut alias = json!({"name": name, "canonical": tool["canonical_name"]});
                let definition = &tool["definition"]["function"]["parameters"];
                let required: Vec<&str> =
                    definition["required"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
                let optional: Vec<String> = definition["properties"]
                    .as_object()
                    .map(|p| p.keys().filter(|k| !required.contains(&k.as_str())).cloned().collect())
                    .unwrap_or_default();
                if !optional.is_empty() && rng.chance(40) {
                    alias["omit"] = json!([rng.pick(&optional)]);
                } else if let Some(param) = required.first().filter(|_| rng.chance(40)) {
                    alias["params"] = json!({format!("p_{param}"): {"maps_to": param, "description": "Renamed."}});
                }
                if rng.chance(50) {
                    let wire = rng.pick(catalog)["name"].as_str().expect("wire").to_owned();
                    alias["description"] = json!(format!("{} {{{{{wire}}}}}.", rng.word(&text_alphabet(), 0, 30)));
                }
                if rng.chance(30) {
                    alias = json!({"type": "function", "function": {"name": alias["name"]}, "canonical": alias["canonical"],
                        "omit": alias.get("omit").cloned().unwrap_or(json!([]))});
                }
                alias
            }
            _ => {
                let name = format!("rt_{}", rng.word(&lower(), 1, 20));
                json!({"type": "function", "function": {"name": name, "description": "Routed.", "parameters": parameters(rng)},
                    "route": {"kind": "runner", "runner_executor_public_id": Uuid::from_u64_pair(rng.next(), rng.next()),
                              "tool_name": format!("srv_{}", rng.word(&lower(), 1, 10))}})
            }
        };
        let mut entry = entry;
        if rng.chance(25) {
            entry["defer_loading"] = json!(rng.chance(50));
        }
        if taken.insert(entry_name(&entry).to_owned()) {
            list.push(entry);
        }
    }
    list
}

#[tokio::test]
async fn prop_canonical_storage_is_idempotent() {
    let seed = seed();
    let mut rng = Rng::new(seed);
    let d = door().await;
    let catalog = d.declarable().await;
    let canonicals: Vec<Value> = catalog.iter().map(|t| t["canonical_name"].clone()).collect();
    for iteration in 0..30 {
        let tools = valid_tool_list(&mut rng, &catalog);
        let mut kernel_tools: Vec<Value> = canonicals.iter().filter(|_| rng.chance(15)).cloned().collect();
        kernel_tools.dedup();
        let runners: Vec<Uuid> = (0..rng.below(3)).map(|_| Uuid::from_u64_pair(rng.next(), rng.next())).collect();
        let runner_tool_names = if rng.chance(50) {
            Value::Null
        } else {
            json!((0..rng.below(3)).map(|_| rng.word(&lower(), 1, 9)).collect::<Vec<_>>())
        };
        let body = json!({"configuration": {"approval_mode": "bypass", "tool_definitions": tools, "kernel_tools": kernel_tools,
            "runner_executor_public_ids": runners, "runner_tool_names": runner_tool_names}});
        let at = format!("seed {seed}, iteration {iteration}: {body}");
        let first = d.http.declare(&body).await;
        assert_eq!(first.status, 200, "{at} -> {:?}", first.body);
        let (stored_once, _) = d.stored().await;
        let read_once = d.read().await;
        // The GET output is itself a PUT body, and redeclaring it converges byte for byte.
        let again = d.http.declare(&read_once).await;
        assert_eq!(again.status, 200, "{at}: the GET output was refused: {:?}", again.body);
        let (stored_twice, _) = d.stored().await;
        let read_twice = d.read().await;
        assert_eq!(stored_twice, stored_once, "{at}: the stored bytes moved");
        assert_eq!(read_twice["configuration"], read_once["configuration"], "{at}");
        // The original authored body converges on the same bytes as well.
        assert_eq!(d.http.declare(&body).await.status, 200, "{at}");
        assert_eq!(d.stored().await.0, stored_once, "{at}: the authored body stores other bytes on a repeat");
        let stored_tools = read_once["configuration"]["tool_definitions"].as_array().cloned().expect("list");
        let names: Vec<&str> = stored_tools.iter().map(entry_name).collect();
        let mut sorted = names.clone();
        sorted.sort_unstable();
        assert_eq!(names, sorted, "{at}: stored canonical by name");
    }
}

// ---- (b) collision names ------------------------------------------------------------------------

fn provider_name_ok(name: &str) -> bool {
    (1..=64).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn model_announcement(name: &str) -> Value {
    json!({"name": name, "description": format!("{name} as served."), "input_schema": {"type": "object"},
        "effect_profile": {"kind": "read_only", "destructive": false, "effect_scope": "closed", "idempotency": "intrinsic", "reconciliation": "none"}})
}

async fn connected(server: &TestServer, name: &str) -> (Minted, RawRunner) {
    let runner = server.runner(name).await;
    let (raw, hello) = RawRunner::connect(&server.url(), runner.id, &runner.token).await;
    assert_eq!(hello.code(), None, "{hello:?}");
    (runner, raw)
}

#[tokio::test]
async fn prop_collision_names_are_stable_and_fit_every_provider() {
    let seed = seed();
    let mut rng = Rng::new(seed);
    let d = door().await;
    // Kernel names a runner may announce (outside the reserved namespaces): they always collide.
    let announceable_kernel = ["memory_read", "memory_write", "memory_ls", "memory_grep", "skill"];
    let kernel_names: HashSet<String> =
        d.catalog().await.iter().filter_map(|t| t["name"].as_str().map(str::to_owned)).collect();
    let (one, raw_one) = connected(&d.server, "one").await;
    let (two, raw_two) = connected(&d.server, "two").await;
    for iteration in 0..12 {
        let mut served: Vec<String> = Vec::new();
        for _ in 0..1 + rng.below(24) {
            let name = if rng.chance(10) {
                (*rng.pick(&announceable_kernel)).to_owned()
            } else {
                let len = if rng.chance(50) { 45 + rng.below(20) } else { 1 + rng.below(64) };
                rng.word(&provider_alphabet(), len, len)
            };
            let reserved = kernel_names.contains(&name) && !announceable_kernel.contains(&name.as_str());
            if !reserved && !served.contains(&name) {
                served.push(name);
            }
        }
        let announcement = json!({"tools": served.iter().map(|n| model_announcement(n)).collect::<Vec<_>>()});
        for raw in [&raw_one, &raw_two] {
            assert_eq!(raw.announce(&announcement).await.code(), None, "seed {seed}, iteration {iteration}");
        }
        // Half of the ordinary served names are declared explicitly; kernel names collide anyway.
        let explicit: Vec<&String> =
            served.iter().filter(|n| !kernel_names.contains(*n)).filter(|_| rng.chance(50)).collect();
        let colliding: HashSet<&str> =
            served.iter().filter(|n| kernel_names.contains(*n) || explicit.contains(n)).map(String::as_str).collect();
        let tool_definitions: Vec<Value> = explicit
            .iter()
            .map(|n| json!({"type": "function", "function": {"name": n, "description": "explicit", "parameters": {"type": "object"}}}))
            .collect();
        let configuration =
            json!({"runner_executor_public_ids": [one.id, two.id], "tool_definitions": tool_definitions});
        let at = format!("seed {seed}, iteration {iteration}, served {served:?}");
        let mut by_runner = Vec::new();
        for runner in [one.id, two.id] {
            let body = json!({"default_runner_executor_public_id": runner, "configuration": configuration});
            let first = d.http.post("/agent_api/v1/tools/assembly", &body).await;
            let second = d.http.post("/agent_api/v1/tools/assembly", &body).await;
            assert_eq!(first.status, 200, "{at}: {:?}", first.body);
            assert_eq!(
                first.body["tool_definitions"], second.body["tool_definitions"],
                "{at}: the same input gave other names"
            );
            let entries = first.body["tool_definitions"].as_array().cloned().expect("list");
            let names: Vec<&str> = entries.iter().map(entry_name).collect();
            let unique: HashSet<&str> = names.iter().copied().collect();
            assert_eq!(unique.len(), names.len(), "{at}: duplicate callables {names:?}");
            let imports: Vec<&Value> = entries.iter().filter(|e| e.get("route").is_some()).collect();
            assert_eq!(imports.len(), served.len(), "{at}: every model announcement is imported once");
            let mut qualified = Vec::new();
            for entry in imports {
                let name = entry_name(entry);
                let served_name = entry["route"]["tool_name"].as_str().expect("served name");
                assert!(provider_name_ok(name), "{at}: {name:?} breaks ^[a-zA-Z0-9_-]{{1,64}}$");
                assert_eq!(entry["route"]["runner_executor_public_id"], json!(runner), "{at}");
                if colliding.contains(served_name) {
                    let head: String = served_name.chars().take(49).collect();
                    let suffix = name
                        .strip_prefix(&format!("{head}__"))
                        .unwrap_or_else(|| panic!("{at}: {name} for {served_name}"));
                    assert!(
                        suffix.len() == 12 && suffix.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
                        "{at}: {name} does not end in 12 hex characters"
                    );
                    qualified.push((served_name.to_owned(), name.to_owned()));
                } else {
                    assert_eq!(name, served_name, "{at}: a name without a collision keeps its served name");
                }
            }
            qualified.sort();
            by_runner.push(qualified);
        }
        // The digest covers the full Runner UUID: the same served names qualify differently.
        for ((served_one, name_one), (served_two, name_two)) in by_runner[0].iter().zip(&by_runner[1]) {
            assert_eq!(served_one, served_two);
            assert_ne!(name_one, name_two, "{at}: {served_one} qualified alike on two runners");
        }
    }
}

// ---- (c) a refused PUT changes nothing ----------------------------------------------------------

/// A valid body with both documents and a few random fields.
fn valid_body(rng: &mut Rng) -> Value {
    let mut configuration =
        json!({"approval_mode": rng.pick(&["bypass", "ask", "rules"]), "default_model": "scripted/default"});
    if rng.chance(50) {
        configuration["tool_definitions"] = json!([{"type": "function", "function": {"name": format!("fn_{}", rng.word(&lower(), 1, 8)), "parameters": {"type": "object"}}}]);
    }
    if rng.chance(50) {
        configuration["conversation_reach"] = json!(rng.pick(&["workspace", "subtree"]));
    }
    if rng.chance(50) {
        configuration["fallback_models"] = json!(["scripted/default"]);
    }
    json!({"configuration": configuration, "prompt_documents": {
        "system_prompt": {"content": format!("{} {{{{agent}}}}", rng.word(&text_alphabet(), 0, 40))},
        "summarizer": {"content": rng.word(&text_alphabet(), 0, 40)}}})
}

/// A body refused with `(status, code)`: a valid body with one part broken.
fn invalid_body(rng: &mut Rng) -> (Value, u16, &'static str) {
    let mut body = valid_body(rng);
    let junk = rng.word(&lower(), 1, 12);
    let field = |body: &mut Value, name: &str, value: Value| body["configuration"][name] = value;
    match rng.below(16) {
        0 => field(&mut body, "approval_mode", json!(format!("x{junk}"))),
        1 => field(
            &mut body,
            "tool_definitions",
            json!([{"type": "function", "name": junk}, {"type": "function", "function": {"name": junk}}]),
        ),
        2 => {
            let defer = rng.pick(&[json!(null), json!("true"), json!(1), json!([]), json!({})]).clone();
            field(&mut body, "tool_definitions", json!([{"type": "function", "name": "f", "defer_loading": defer}]));
        }
        3 => field(
            &mut body,
            "tool_definitions",
            json!([{"type": "function", "name": "f", "route": {"kind": format!("x{junk}"), "runner_executor_public_id": Uuid::new_v4(), "tool_name": "f"}}]),
        ),
        4 => field(
            &mut body,
            "tool_definitions",
            json!([{"type": "function", "function": {"name": "ask", "description": junk}}]),
        ),
        5 => field(&mut body, "kernel_tools", json!([format!("nexus.{junk}")])),
        6 => field(&mut body, "runner_executor_public_ids", json!([junk])),
        7 => field(
            &mut body,
            "lifecycle_hooks",
            json!({"stop": {"tool": "t", "timeout_ms": 300_001 + rng.below(1000), "max_continuations": 0}}),
        ),
        8 => field(&mut body, "fallback_models", json!([rng.below(100)])),
        9 => field(&mut body, "conversation_reach", json!(format!("x{junk}"))),
        10 => field(
            &mut body,
            "memory_context_limit",
            json!({"bindings": [{"name": "workspace", "scope": "workspace", "access": "read"}]}),
        ),
        11 => field(&mut body, "default_model", json!(format!("{junk}-model"))),
        12 => {
            body["prompt_documents"]["system_prompt"]["content"] = json!(format!("{{{{z{junk}}}}}"));
            return (body, 422, "prompt_document_macro_unknown");
        }
        13 => {
            body["prompt_documents"]["summarizer"] = json!({"content": "x".repeat(65_537 + rng.below(100))});
            return (body, 422, "prompt_document_too_large");
        }
        14 => {
            body["prompt_documents"]["summarizer"]["role"] = json!(rng.pick(&["developer", "user", "assistant"]));
            return (body, 422, "prompt_document_invalid");
        }
        _ => {
            if rng.chance(50) {
                body["configuration"] = rng.pick(&[json!(null), json!([]), json!("x"), json!(3)]).clone();
            } else {
                body["prompt_documents"] =
                    rng.pick(&[json!([]), json!("x"), json!(3), json!({"summarizer": "x"})]).clone();
            }
            return (body, 400, "parameter_missing");
        }
    }
    (body, 422, "validation_failed")
}

#[tokio::test]
async fn prop_a_refused_write_changes_nothing() {
    let seed = seed();
    let mut rng = Rng::new(seed);
    let d = door().await;
    for iteration in 0..60 {
        if iteration % 10 == 0 {
            let seeded = d.http.declare(&valid_body(&mut rng)).await;
            assert_eq!(seeded.status, 200, "seed {seed}, iteration {iteration}: {:?}", seeded.body);
        }
        let before = (d.stored().await, d.read().await);
        let (body, status, code) = invalid_body(&mut rng);
        let answer: Answer = d.http.declare(&body).await;
        let at = format!("seed {seed}, iteration {iteration}");
        assert_eq!((answer.status, answer.code()), (status, Some(code)), "{at}: {body} -> {:?}", answer.body);
        assert_eq!((d.stored().await, d.read().await), before, "{at}: a refused PUT changed the profile: {body}");
        // The slot door's refusals change nothing either.
        let slot = *rng.pick(&["system_prompt", "summarizer"]);
        let (edit, code) = match rng.below(3) {
            0 => {
                (json!({"content": format!("{{{{q{}}}}}", rng.word(&lower(), 1, 6))}), "prompt_document_macro_unknown")
            }
            1 => (json!({"content": "x".repeat(65_537)}), "prompt_document_too_large"),
            _ => (json!({"content": "x", "role": "user"}), "prompt_document_invalid"),
        };
        let answer = d.http.put(&format!("/agent_api/v1/profile/prompt_documents/{slot}"), &edit).await;
        assert_eq!((answer.status, answer.code()), (422, Some(code)), "{at}: {slot} {edit}");
        assert_eq!((d.stored().await, d.read().await), before, "{at}: a refused slot edit changed the profile");
    }
}

// ---- concurrency --------------------------------------------------------------------------------

/// The complete state number `i`: a configuration and both documents, distinct in every field.
fn complete_state(i: usize) -> Value {
    let kernel = ["nexus.memory.read", "nexus.memory.ls", "nexus.tools.search", "nexus.skill.load"];
    let modes = ["bypass", "ask", "rules"];
    let reaches = ["workspace", "subtree"];
    let kernel_tools = &kernel[..i % kernel.len() + 1];
    json!({
        "configuration": {
            "approval_mode": modes[i % 3],
            "default_model": "scripted/default",
            "tool_definitions": [
                {"type": "function", "function": {"name": format!("s{i}_a"), "description": format!("state {i}"), "parameters": {"type": "object"}}},
                {"type": "function", "function": {"name": format!("s{i}_b"), "description": format!("state {i}"), "parameters": {"type": "object"}}},
            ],
            "kernel_tools": kernel_tools,
            "conversation_reach": reaches[i % 2],
            "fallback_models": vec!["scripted/default"; i % 3],
            "approval_rules": [{"tool": format!("s{i}_*"), "verdict": "allow"}],
        },
        "prompt_documents": {"system_prompt": {"content": format!("system {i}")}, "summarizer": {"content": format!("summary {i}")}},
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_puts_and_slot_edits_serialize_on_the_agent() {
    let d = door().await;
    let seeded = d.http.declare(&complete_state(100)).await;
    assert_eq!(seeded.status, 200);
    for round in 0..3 {
        let (start_bytes, before) = d.stored().await;
        let start: Value = serde_json::from_str(&start_bytes).expect("stored json");
        let v0_system = before["system_prompt_version"].as_i64().expect("version");
        let v0_summary = before["summarizer_version"].as_i64().expect("version");
        let puts = 10;
        let edits = 10;
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..puts {
            let http = d.http.clone();
            tasks.spawn(async move { ("put", i, http.declare(&complete_state(i)).await) });
        }
        for j in 0..edits {
            let http = d.http.clone();
            let slot = if j % 2 == 0 { "system_prompt" } else { "summarizer" };
            tasks.spawn(async move {
                let path = format!("/agent_api/v1/profile/prompt_documents/{slot}");
                (slot, j, http.put(&path, &json!({"content": format!("edit {j}")})).await)
            });
        }
        for _ in 0..8 {
            let http = d.http.clone();
            tasks.spawn(async move { ("read", 0, http.profile().await) });
        }
        let mut answers = Vec::new();
        while let Some(joined) = tasks.join_next().await {
            answers.push(joined.expect("task"));
        }
        let at = format!("round {round}");
        // Every whole configuration a PUT answered with is exactly its own state.
        let mut wholes = vec![start];
        let (mut system_versions, mut summary_versions) = (Vec::new(), Vec::new());
        let (mut system_writes, mut summary_writes) = (0, 0);
        let mut reads = Vec::new();
        for (kind, i, answer) in &answers {
            match *kind {
                "put" => {
                    assert_eq!(answer.status, 200, "{at}: PUT {i}: {:?}", answer.body);
                    let names: Vec<&str> = answer.body["configuration"]["tool_definitions"]
                        .as_array()
                        .expect("list")
                        .iter()
                        .map(entry_name)
                        .collect();
                    assert_eq!(names, [format!("s{i}_a"), format!("s{i}_b")], "{at}: PUT {i} answered another state");
                    assert_eq!(answer.body["configuration"]["approval_rules"][0]["tool"], json!(format!("s{i}_*")));
                    wholes.push(answer.body["configuration"].clone());
                    system_versions
                        .push(answer.body["prompt_documents"]["system_prompt"]["version"].as_i64().expect("v"));
                    summary_versions
                        .push(answer.body["prompt_documents"]["summarizer"]["version"].as_i64().expect("v"));
                    system_writes += 1;
                    summary_writes += 1;
                }
                "read" => {
                    assert_eq!(answer.status, 200);
                    reads.push(answer.body["configuration"].clone());
                }
                slot => {
                    assert_eq!(answer.status, 200, "{at}: edit {i} of {slot}: {:?}", answer.body);
                    let version = answer.body["version"].as_i64().expect("version");
                    if slot == "system_prompt" {
                        system_versions.push(version);
                        system_writes += 1;
                    } else {
                        summary_versions.push(version);
                        summary_writes += 1;
                    }
                }
            }
        }
        // Serialized writers hand out each version exactly once, with no gap.
        system_versions.sort_unstable();
        summary_versions.sort_unstable();
        assert_eq!(system_versions, ((v0_system + 1)..=(v0_system + system_writes)).collect::<Vec<_>>(), "{at}");
        assert_eq!(summary_versions, ((v0_summary + 1)..=(v0_summary + summary_writes)).collect::<Vec<_>>(), "{at}");
        let (stored_bytes, after) = d.stored().await;
        assert_eq!(after["system_prompt_version"], json!(v0_system + system_writes), "{at}");
        assert_eq!(after["summarizer_version"], json!(v0_summary + summary_writes), "{at}");
        // The stored configuration is one submitted whole, never a mix; so is every read.
        let stored: Value = serde_json::from_str(&stored_bytes).expect("stored json");
        assert!(wholes[1..].contains(&stored), "{at}: the stored configuration is no single PUT's: {stored}");
        for read in reads {
            assert!(wholes.contains(&read), "{at}: a concurrent read saw a mix: {read}");
        }
        let submitted_documents: BTreeSet<String> = (0..puts)
            .map(|i| format!("system {i}"))
            .chain((0..puts).map(|i| format!("summary {i}")))
            .chain((0..edits).map(|j| format!("edit {j}")))
            .collect();
        for slot in ["system_prompt", "summarizer"] {
            let content = after[slot]["content"].as_str().expect("content").to_owned();
            assert!(submitted_documents.contains(&content), "{at}: {slot} holds {content}");
        }
    }
}
