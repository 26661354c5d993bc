//! The tool grammar's tests, over the module's public surface.

use nexus_kernel_tools::lookup;
use nexus_proto::{ErrorCode, Refusal, RunnerId};
use serde_json::{Value, json};

use super::*;
use crate::declaration::validate_configuration;

const RUNNER: &str = "00000000-0000-4000-8000-000000000001";

fn accept_all(_: &str) -> Result<(), (String, String)> {
    Ok(())
}

fn runner_id() -> RunnerId {
    RUNNER.parse().expect("uuid")
}

fn runner(id: RunnerId, tools: Value) -> RunnerFacts {
    RunnerFacts {
        public_id: id,
        display_name: "r".into(),
        eligibility: Eligibility::Eligible,
        announcement: json!({"tools": tools, "environment": {"os": "linux"}, "documents": []}),
    }
}

fn visible(name: &str) -> Value {
    json!({"name": name, "description": "d", "input_schema": {"type": "object"},
           "effect_profile": {"kind":"write","destructive":true,"effect_scope":"open","idempotency":"none","reconciliation":"none"},
           "timeout_ms": 1000})
}

fn config(value: Value) -> Value {
    validate_configuration(value.as_object().expect("object"), &accept_all).expect("valid")
}

fn definitions(list: Value) -> Result<Value, Refusal> {
    canonical_tool_definitions(Some(&list))
}

/// The refusal word of a list: the message is `configuration.tool_definitions...: word: ...`.
fn word_of(list: Value) -> (String, String) {
    let refusal = definitions(list).expect_err("refused");
    assert_eq!(refusal.code, ErrorCode::ValidationFailed);
    let (path, rest) = refusal.message.split_once(": ").expect("path: word");
    let word = rest.split(':').next().unwrap_or_default().to_owned();
    (path.to_owned(), word)
}

fn kernel(name: &str) -> Value {
    lookup(name).expect("live").definition().clone()
}

fn plain(name: &str) -> Value {
    json!({"type":"function","function":{"name": name,"description":"d","parameters":{"type":"object"}}})
}

fn routed(name: &str, route: Value) -> Value {
    json!({"type":"function","function":{"name": name,"parameters":{"type":"object"}},"route": route})
}

fn agent_alias() -> Value {
    json!({"name": "Agent", "canonical": "nexus.graph.delegate_task",
           "params": {"run_in_background": {"maps_to": "wait", "invert": true, "description": "Run it in the background."}}})
}

/// An alias of a served kernel tool with an inverted boolean: `Question` spells `ask`, and its
/// `single` is `multi` inverted. The assembly tests below validate their configurations whole,
/// served check included, so they spell served tools; the pure grammar tests keep `Agent`.
fn question_alias() -> Value {
    json!({"name": "Question", "canonical": "nexus.human.ask",
           "params": {"single": {"maps_to": "multi", "invert": true, "description": "true allows one option only."}}})
}

fn frozen_tools(cfg: Value, runners: &[RunnerFacts]) -> Vec<FrozenTool> {
    freeze(&config(cfg), None, RunnerSelection::FirstEligible, runners, None).expect("frozen").tools
}

/// One row per refusal, each named after its requirement: (row, list, path, word).
#[test]
fn r13_to_r23_declaration_refusals() {
    let uuid = json!(RUNNER);
    let rows: Vec<(&str, Value, &str, &str)> = vec![
        ("R13 not a list", json!({"a": 1}), "configuration.tool_definitions", "invalid"),
        ("R13 entry not an object", json!([plain("a"), "b"]), "configuration.tool_definitions[1]", "invalid"),
        (
            "R15 defer_loading null",
            json!([{"type":"function","name":"a","defer_loading":null}]),
            "configuration.tool_definitions[0].defer_loading",
            "invalid",
        ),
        (
            "R15 defer_loading string",
            json!([{"type":"function","name":"a","defer_loading":"true"}]),
            "configuration.tool_definitions[0].defer_loading",
            "invalid",
        ),
        (
            "R15 defer_loading number",
            json!([{"type":"function","name":"a","defer_loading":1}]),
            "configuration.tool_definitions[0].defer_loading",
            "invalid",
        ),
        (
            "R15 defer_loading array",
            json!([{"type":"function","name":"a","defer_loading":[]}]),
            "configuration.tool_definitions[0].defer_loading",
            "invalid",
        ),
        (
            "R16 kind",
            json!([routed("a", json!({"kind":"mcp","runner_executor_public_id":uuid,"tool_name":"a"}))]),
            "configuration.tool_definitions[0].route",
            "invalid_tool_route",
        ),
        (
            "R16 extra key",
            json!([routed("a", json!({"kind":"runner","runner_executor_public_id":uuid,"tool_name":"a","x":1}))]),
            "configuration.tool_definitions[0].route",
            "invalid_tool_route",
        ),
        (
            "R16 malformed uuid",
            json!([routed("a", json!({"kind":"runner","runner_executor_public_id":"nope","tool_name":"a"}))]),
            "configuration.tool_definitions[0].route",
            "invalid_tool_route",
        ),
        (
            "R16 missing uuid",
            json!([routed("a", json!({"kind":"runner","tool_name":"a"}))]),
            "configuration.tool_definitions[0].route",
            "runner_target_required",
        ),
        (
            "R16 null uuid",
            json!([routed("a", json!({"kind":"runner","runner_executor_public_id":null,"tool_name":"a"}))]),
            "configuration.tool_definitions[0].route",
            "runner_target_required",
        ),
        (
            "R16 missing tool_name",
            json!([routed("a", json!({"kind":"runner","runner_executor_public_id":uuid}))]),
            "configuration.tool_definitions[0].route",
            "invalid_tool_route",
        ),
        (
            "R16 empty tool_name",
            json!([routed("a", json!({"kind":"runner","runner_executor_public_id":uuid,"tool_name":""}))]),
            "configuration.tool_definitions[0].route",
            "invalid_tool_route",
        ),
        (
            "R16 long tool_name",
            json!([routed("a", json!({"kind":"runner","runner_executor_public_id":uuid,"tool_name":"t".repeat(129)}))]),
            "configuration.tool_definitions[0].route",
            "invalid_tool_route",
        ),
        (
            "R16 NUL tool_name",
            json!([routed("a", json!({"kind":"runner","runner_executor_public_id":uuid,"tool_name":"a\u{0}b"}))]),
            "configuration.tool_definitions[0].route",
            "invalid_tool_route",
        ),
        (
            "R16 kernel tool_name",
            json!([routed("a", json!({"kind":"runner","runner_executor_public_id":uuid,"tool_name":"memory_read"}))]),
            "configuration.tool_definitions[0].route",
            "invalid_tool_route",
        ),
        (
            "R16 kernel callable routed",
            json!([routed("wait", json!({"kind":"runner","runner_executor_public_id":uuid,"tool_name":"w"}))]),
            "configuration.tool_definitions[0].route",
            "invalid_tool_route",
        ),
        (
            "R16 alias routed",
            json!([{"name":"s","canonical":"nexus.skill.load","route":{"kind":"runner","runner_executor_public_id":uuid,"tool_name":"s"}}]),
            "configuration.tool_definitions[0].route",
            "invalid_tool_route",
        ),
        (
            "R18 duplicate plain",
            json!([plain("a"), {"type":"function","name":"a"}]),
            "configuration.tool_definitions[1]",
            "duplicate_tool_name",
        ),
        (
            "R18 duplicate alias and plain",
            json!([plain("Agent"), agent_alias()]),
            "configuration.tool_definitions[1]",
            "duplicate_tool_name",
        ),
        (
            "R18 duplicate kernel entry and identity alias",
            json!([kernel("skill"), {"name":"skill","canonical":"nexus.skill.load"}]),
            "configuration.tool_definitions[1]",
            "duplicate_tool_name",
        ),
        (
            "R19 kernel name in other bytes",
            json!([plain("wait")]),
            "configuration.tool_definitions[0]",
            "kernel_tool_redefined",
        ),
        (
            "R19 canonical spelling as a plain name",
            json!([plain("nexus.graph.wait")]),
            "configuration.tool_definitions[0]",
            "kernel_tool_redefined",
        ),
        (
            "R19 kernel bytes plus strict",
            json!([{"type":"function","function":kernel("wait")["function"].clone(),"strict":true}]),
            "configuration.tool_definitions[0]",
            "kernel_tool_redefined",
        ),
        (
            "R20 alias_canonical_unknown",
            json!([{"name":"x","canonical":"nexus.graph.compose"}]),
            "configuration.tool_definitions[0]",
            "alias_canonical_unknown",
        ),
        (
            "R20 alias_name_reserved",
            json!([{"name":"ask","canonical":"nexus.skill.load"}]),
            "configuration.tool_definitions[0]",
            "alias_name_reserved",
        ),
        (
            "R20 alias_param_unknown",
            json!([plain("z"), {"name":"x","canonical":"nexus.skill.load","omit":["nope"]}]),
            "configuration.tool_definitions[1]",
            "alias_param_unknown",
        ),
        (
            "R20 alias_invert_needs_boolean",
            json!([{"name":"x","canonical":"nexus.memory.delete","params":{"p":{"maps_to":"path","invert":true,"description":"d"}}}]),
            "configuration.tool_definitions[0]",
            "alias_invert_needs_boolean",
        ),
        (
            "R20 alias_param_description_required",
            json!([{"name":"x","canonical":"nexus.graph.delegate_task","params":{"bg":{"maps_to":"wait","invert":true}}}]),
            "configuration.tool_definitions[0]",
            "alias_param_description_required",
        ),
        (
            "R20 alias function block redefined",
            json!([{"type":"function","function":{"name":"x","description":"mine"},"canonical":"nexus.skill.load"}]),
            "configuration.tool_definitions[0]",
            "kernel_tool_redefined",
        ),
        (
            "R20 alias name invalid",
            json!([{"name":"","canonical":"nexus.skill.load"}]),
            "configuration.tool_definitions[0]",
            "invalid",
        ),
        ("provider rule: dotted name", json!([plain("my.tool")]), "configuration.tool_definitions[0]", "invalid"),
        (
            "provider rule: 65 characters",
            json!([plain(&"a".repeat(65))]),
            "configuration.tool_definitions[0]",
            "invalid",
        ),
        (
            "provider rule: alias name",
            json!([{"name":"my skill","canonical":"nexus.skill.load"}]),
            "configuration.tool_definitions[0]",
            "invalid",
        ),
        (
            "name missing",
            json!([{"type":"function","function":{"description":"d"}}]),
            "configuration.tool_definitions[0]",
            "invalid",
        ),
    ];
    for (row, list, path, word) in rows {
        let (got_path, got_word) = word_of(list);
        assert_eq!((got_path.as_str(), got_word.as_str()), (path, word), "{row}");
    }
}

/// The refusal order (`docs/declaration.md`, "Refusal order"): each row breaks two rules; the
/// earlier word wins.
#[test]
fn refusal_order() {
    let bad_route = json!({"kind":"runner","tool_name":"a"});
    let rows: Vec<(&str, Value, &str)> = vec![
        (
            "duplicate before defer",
            json!([{"type":"function","name":"b","defer_loading":1}, plain("a"), plain("a")]),
            "duplicate_tool_name",
        ),
        (
            "defer before route",
            json!([routed("b", bad_route.clone()), {"type":"function","name":"a","defer_loading":"x"}]),
            "invalid",
        ),
        (
            "route before alias",
            json!([{"name":"x","canonical":"nexus.nope"}, routed("b", bad_route)]),
            "runner_target_required",
        ),
        (
            "alias before kernel bytes",
            json!([plain("wait"), {"name":"x","canonical":"nexus.nope"}]),
            "alias_canonical_unknown",
        ),
        ("canonical before reserved", json!([{"name":"ask","canonical":"nexus.nope"}]), "alias_canonical_unknown"),
        (
            "reserved before params",
            json!([{"name":"ask","canonical":"nexus.skill.load","omit":["nope"]}]),
            "alias_name_reserved",
        ),
        (
            "invert type before description",
            json!([{"name":"x","canonical":"nexus.skill.load","params":{"n":{"maps_to":"name","invert":true}}}]),
            "alias_invert_needs_boolean",
        ),
    ];
    for (row, list, word) in rows {
        assert_eq!(word_of(list).1, word, "{row}");
    }
}

#[test]
fn r13_bound_and_sorted_storage() {
    let stored = definitions(json!([plain("zeta"), plain("alpha"), kernel("wait")])).expect("valid");
    let names: Vec<&str> = stored.as_array().expect("list").iter().filter_map(entry_name).collect();
    assert_eq!(names, ["alpha", "wait", "zeta"]);
    let big = json!([{"type":"function","function":{"name":"big","description":"x".repeat(TOOL_DEFINITIONS_BOUND),"parameters":{}}}]);
    let refusal = definitions(big).expect_err("over bound");
    assert_eq!(refusal.code, ErrorCode::ValidationFailed);
    assert!(refusal.message.starts_with("configuration.tool_definitions: tool_definitions_bound"));
    assert_eq!(definitions(json!([])).expect("empty"), json!([]));
    assert_eq!(canonical_tool_definitions(None).expect("omitted"), json!([]));
    let inline = canonical_tool_definitions_at("execution_declaration.tool_definitions", Some(&json!([plain("wait")])));
    assert!(
        inline
            .expect_err("refused")
            .message
            .starts_with("execution_declaration.tool_definitions[0]: kernel_tool_redefined")
    );
}

#[test]
fn r19_r22_kernel_bytes_and_respelling() {
    // No alias: the catalog's bytes exactly, with or without defer_loading, nested or flat.
    let wait = kernel("wait");
    let stored = definitions(json!([wait.clone()])).expect("exact kernel entry");
    assert_eq!(stored, json!([wait.clone()]));
    let mut deferred = wait.clone();
    deferred["defer_loading"] = json!(true);
    assert_eq!(definitions(json!([deferred.clone()])).expect("deferred"), json!([deferred]));
    let function = &wait["function"];
    let flat = json!({"type":"function","name":"wait","description":function["description"],"parameters":function["parameters"]});
    assert_eq!(definitions(json!([flat])).expect("flat kernel entry"), json!([wait.clone()]));

    // An alias re-spells every description of the set: the plain wait entry in catalog bytes
    // is stored as the re-spelled render, and that render is accepted as authored too.
    let stored = definitions(json!([wait.clone(), agent_alias()])).expect("valid");
    let stored_wait = &stored[1];
    assert_eq!(entry_name(stored_wait), Some("wait"));
    let description = stored_wait["function"]["description"].as_str().expect("text");
    assert!(description.contains("started with Agent or spawn"), "{description}");
    assert_eq!(definitions(json!([stored_wait.clone(), agent_alias()])).expect("re-spelled accepted"), stored);
    // Another spelling of the macro is a redefinition.
    let mut wrong = stored_wait.clone();
    wrong["function"]["description"] = json!(description.replace("Agent", "Helper"));
    assert_eq!(word_of(json!([wrong, agent_alias()])).1, "kernel_tool_redefined");
}

#[test]
fn r20_r23_aliases_stored_as_renders() {
    let compact =
        json!({"type":"function","function":{"name":"skill"},"canonical":"nexus.skill.load","defer_loading":true});
    let stored = definitions(json!([compact])).expect("R23 compact identity alias");
    assert_eq!(stored[0]["function"], kernel("skill")["function"]);
    assert_eq!(stored[0]["canonical"], "nexus.skill.load");
    assert_eq!(stored[0]["defer_loading"], true);

    let stored = definitions(json!([agent_alias(), kernel("ask")])).expect("valid");
    let agent = &stored[0];
    assert_eq!(agent["type"], "function");
    assert_eq!(agent["function"]["name"], "Agent");
    assert_eq!(agent["function"]["parameters"]["properties"]["run_in_background"]["default"], true);
    assert!(agent["function"]["parameters"]["properties"].get("wait").is_none());
    assert_eq!(agent["params"], agent_alias()["params"], "the facts stay beside the render");
    // Several spellings of one canonical, the plain name among them, are lawful.
    let both = definitions(
        json!([agent_alias(), {"name":"Helper","canonical":"nexus.graph.delegate_task"}, kernel("delegate_task")]),
    );
    assert_eq!(both.expect("lawful").as_array().map(Vec::len), Some(3));
}

#[test]
fn canonical_form_is_idempotent() {
    let list = json!([
        plain("zeta"),
        {"type":"function","name":"flat","description":"d","parameters":{"type":"object"},"strict":true},
        routed("deploy", json!({"kind":"runner","runner_executor_public_id":RUNNER,"tool_name":"deploy"})),
        kernel("wait"),
        kernel("tool_search"),
        agent_alias(),
        {"name":"Await","canonical":"nexus.graph.wait","omit":["run_public_id"],"description":"Block on {{delegate_task}} work.","defer_loading":false},
        {"type":"function","function":{"name":"skill"},"canonical":"nexus.skill.load","defer_loading":true},
    ]);
    let once = definitions(list).expect("valid");
    let twice = definitions(once.clone()).expect("stored form is lawful");
    assert_eq!(twice, once);
    assert_eq!(twice.to_string(), once.to_string(), "byte-stable");
    // The Await alias renders the macro with the Agent spelling; the wait entry renders
    // {{delegate_task}} as Agent.
    let await_entry = once.as_array().expect("list").iter().find(|e| entry_name(e) == Some("Await")).expect("Await");
    assert_eq!(await_entry["function"]["description"], "Block on Agent work.");
    assert_eq!(await_entry["description"], "Block on {{delegate_task}} work.", "the fact keeps its macros");
}

#[test]
fn r14_r15_r17_wire_projection_and_visibility() {
    let cfg = json!({"approval_mode": "bypass", "tool_definitions": [
        plain("nostrict"),
        {"type":"function","function":{"name":"fstrict","parameters":{},"strict":true}},
        {"type":"function","function":{"name":"estrict","parameters":{}},"strict":false},
        {"type":"function","name":"flat","description":"d","parameters":{"type":"object"},"defer_loading":true},
        question_alias(),
    ]});
    let tools = frozen_tools(cfg, &[]);
    let wire = wire_projection(&tools);
    let by_name = |name: &str| wire.iter().find(|w| w["function"]["name"] == name).cloned().expect(name);
    assert_eq!(by_name("nostrict")["strict"], false, "R14 omitted strict becomes false on the wire");
    assert_eq!(by_name("fstrict").get("strict"), None, "R14 explicit strict in the function is kept");
    assert_eq!(by_name("fstrict")["function"]["strict"], true);
    assert_eq!(by_name("estrict")["strict"], false);
    assert_eq!(
        by_name("flat"),
        json!({"type":"function","function":{"name":"flat","description":"d","parameters":{"type":"object"}},"strict":false}),
        "R15 defer_loading is stripped and the flat form nested"
    );
    let agent = by_name("Question");
    let keys: Vec<&str> = agent.as_object().expect("object").keys().map(String::as_str).collect();
    assert_eq!(keys, ["function", "strict", "type"], "R17 alias facts never reach the provider");
    assert_eq!(wire.len(), 5, "no search/call pair: every deferred schema is exposed");
    // The stored declaration is not rewritten.
    assert!(tools.iter().all(|t| t.definition.get("strict").is_none() || t.name == "estrict"));

    // Visibility rows: (row, extra entries, is the deferred entry hidden).
    let deferred = json!({"type":"function","function":{"name":"later","parameters":{}},"defer_loading":true});
    let mut search_deferred = kernel("tool_search");
    search_deferred["defer_loading"] = json!(true);
    let rows: Vec<(&str, Value, bool)> = vec![
        ("R15 eager search and call hide deferred", json!([kernel("tool_search"), kernel("tool_call")]), true),
        ("R15 only search exposes all", json!([kernel("tool_search")]), false),
        ("R15 deferred search exposes all", json!([search_deferred, kernel("tool_call")]), false),
        (
            "R15 aliases count",
            json!([{"name":"Find","canonical":"nexus.tools.search"}, {"name":"Run","canonical":"nexus.tools.call"}]),
            true,
        ),
    ];
    for (row, extra, hidden) in rows {
        let mut list = extra.as_array().cloned().expect("list");
        list.push(deferred.clone());
        let tools = frozen_tools(json!({"approval_mode":"bypass","tool_definitions": list}), &[]);
        let wire = wire_projection(&tools);
        assert_eq!(!wire.iter().any(|w| w["function"]["name"] == "later"), hidden, "{row}");
        assert!(tools.iter().any(|t| t.name == "later"), "{row}: deferral never changes authority");
    }
    // Kernel imports of search and call count too.
    let tools = frozen_tools(
        json!({"approval_mode":"bypass","kernel_tools":["nexus.tools.search","nexus.tools.call"],"tool_definitions":[deferred]}),
        &[],
    );
    assert_eq!(wire_projection(&tools).len(), 2);
}

#[test]
fn r21_alias_calls_resolve_to_the_kernel() {
    let id = runner_id();
    let cfg = json!({"approval_mode": "bypass", "runner_executor_public_ids": [id], "tool_definitions": [
        question_alias(),
        kernel("ask"),
        routed("shell", json!({"kind":"runner","runner_executor_public_id":id,"tool_name":"bash"})),
    ]});
    let tools = frozen_tools(cfg, &[runner(id, json!([visible("bash")]))]);
    let find = |name: &str| tools.iter().find(|t| t.name == name).expect(name);
    let question = find("Question");
    assert_eq!(question.canonical_name(), Some("nexus.human.ask"));
    assert_eq!(question.effect_profile.as_ref().map(|p| p["reconciliation"].clone()), Some(json!("lookup")));
    let call = question.resolve_call(&json!({"prompt": "p", "single": true}));
    assert_eq!(call.wire_name, "ask");
    assert_eq!(call.alias.as_deref(), Some("Question"));
    assert_eq!(call.input, json!({"prompt": "p", "multi": false}));
    let ask = find("ask").resolve_call(&json!({"prompt": "?"}));
    assert_eq!((ask.wire_name.as_str(), ask.alias), ("ask", None));
    let shell = find("shell").resolve_call(&json!({"command": "ls"}));
    assert_eq!((shell.wire_name.as_str(), shell.alias.as_deref()), ("bash", Some("shell")));
    assert_eq!(find("shell").canonical_name(), None);
}

#[test]
fn kernel_imports_and_identity_precedence() {
    let cfg = json!({"approval_mode": "bypass",
    "kernel_tools": ["nexus.skill.load", "nexus.memory.write", "nexus.memory.edit"],
    "tool_definitions": [
        {"type":"function","function":{"name":"skill"},"canonical":"nexus.skill.load","defer_loading":true},
        {"name": "Patch", "canonical": "nexus.memory.edit"},
    ]});
    let tools = frozen_tools(cfg, &[]);
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["Patch", "skill", "memory_write", "memory_edit"], "explicit first, then imports in order");
    let skill = &tools[1];
    assert_eq!(skill.definition["defer_loading"], true, "the identity declaration beats the plain import");
    let write = &tools[2];
    assert_eq!(write.canonical.as_deref(), Some("nexus.memory.write"));
    assert!(write.definition["function"]["description"].as_str().expect("text").contains("use Patch"));
    assert_eq!(tools[3].definition["function"]["name"], "memory_edit", "a plain import coexists with an alias");
    assert_eq!(write.effect_profile, Some(lookup("memory_write").expect("live").effect_profile().to_json()));
    // Without aliases the import is the catalog's bytes.
    let tools = frozen_tools(json!({"approval_mode":"bypass","kernel_tools":["nexus.memory.write"]}), &[]);
    assert_eq!(&tools[0].definition, lookup("memory_write").expect("live").definition());
}

#[test]
fn r24_kernel_tools_rows() {
    let rows: Vec<(&str, Value, bool)> = vec![
        ("canonical names", json!(["nexus.memory.read", "nexus.tools.search"]), true),
        ("null", Value::Null, true),
        ("duplicate", json!(["nexus.memory.read", "nexus.memory.read"]), false),
        ("unknown", json!(["nexus.graph.compose"]), false),
        ("wire alias", json!(["memory_read"]), false),
        ("wildcard", json!(["nexus.memory.*"]), false),
        ("not a list", json!("nexus.memory.read"), false),
    ];
    for (row, value, ok) in rows {
        let result = validate_kernel_tools(Some(&value));
        assert_eq!(result.is_ok(), ok, "{row}");
        if let Err(refusal) = result {
            assert_eq!(refusal.code, ErrorCode::ValidationFailed, "{row}");
            assert!(refusal.message.starts_with("configuration.kernel_tools"), "{row}");
        }
    }
}

#[test]
fn r26_imports_selected_runner_narrowed_and_deferred() {
    let id = RunnerId::new_v4();
    let facts = runner(id, json!([visible("bash"), visible("read_file"), {"name": "logs", "effect_profile": {}}]));
    let cfg = config(
        json!({"runner_executor_public_ids": [id], "runner_tool_names": ["bash", "logs"], "approval_mode": "bypass"}),
    );
    let frozen = freeze(&cfg, None, RunnerSelection::FirstEligible, &[facts], None).expect("frozen");
    assert_eq!(frozen.tools.len(), 1, "read_file is not allowed and logs is invisible");
    assert_eq!(frozen.tools[0].name, "bash");
    assert_eq!(frozen.tools[0].definition["defer_loading"], json!(true));
    assert_eq!(frozen.tools[0].route.as_ref().map(|r| r.runner_executor_public_id), Some(id));
    assert_eq!(frozen.default_runner_executor_public_id, Some(id));
    let wire = wire_projection(&frozen.tools);
    assert_eq!(
        wire[0],
        json!({"type":"function","function":{"name":"bash","description":"d","parameters":{"type":"object"}},"strict":false})
    );
}

#[test]
fn r27_collision_names_are_stable_and_fit_providers() {
    let id = runner_id();
    assert_eq!(qualified_name(id, "bash"), "bash__ce37e948ffca");
    assert_eq!(qualified_name(id, "memory_read"), "memory_read__cefde19374ff");
    assert_eq!(qualified_name(id, "fs.read"), "fs_read__3f799c3d7039", "outside the provider rule: sanitized head");
    let long = "x".repeat(70);
    assert_eq!(qualified_name(id, &long), format!("{}__ad2c6f8fef46", "x".repeat(49)));
    assert_eq!(qualified_name(id, &long).len(), 63);

    let facts = runner(
        id,
        json!([visible("bash"), visible("memory_read"), visible("wait"), visible("fs.read"), visible("ok")]),
    );
    let cfg = json!({
        "runner_executor_public_ids": [id],
        "approval_mode": "bypass",
        "kernel_tools": ["nexus.memory.read"],
        "tool_definitions": [plain("bash")]
    });
    let tools = frozen_tools(cfg, &[facts]);
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "bash",
            "memory_read",
            "bash__ce37e948ffca",
            "memory_read__cefde19374ff",
            qualified_name(id, "wait").as_str(),
            "fs_read__3f799c3d7039",
            "ok"
        ]
    );
    for tool in &tools {
        assert!(provider_name_ok(&tool.name), "{} fits ^[a-zA-Z0-9_-]{{1,64}}$", tool.name);
    }
    let served: Vec<Option<&str>> = tools.iter().map(|t| t.route.as_ref().map(|r| r.tool_name.as_str())).collect();
    assert_eq!(served[2..], [Some("bash"), Some("memory_read"), Some("wait"), Some("fs.read"), Some("ok")]);
    assert_eq!(tools[2].resolve_call(&json!({})).wire_name, "bash", "the route keeps the served name");
}

#[test]
fn r28_to_r30_assembly_refusals() {
    let id = RunnerId::new_v4();
    let other = RunnerId::new_v4();
    let cfg = config(json!({"runner_executor_public_ids": [id], "approval_mode": "bypass"}));
    let code = |r: Result<FrozenDeclaration, Refusal>| r.expect_err("refused").code.as_str();
    assert_eq!(
        code(freeze(&cfg, None, RunnerSelection::Named(other), &[runner(id, json!([]))], None)),
        "runner_not_declared"
    );
    let mut revoked = runner(id, json!([]));
    revoked.eligibility = Eligibility::Revoked;
    assert_eq!(code(freeze(&cfg, None, RunnerSelection::Named(id), &[revoked], None)), "runner_not_eligible");
    assert_eq!(
        code(freeze(
            &cfg,
            None,
            RunnerSelection::FirstEligible,
            &[runner(id, json!([visible("bash")]))],
            Some(&["nope".to_owned()])
        )),
        "tool_not_declared"
    );
    let routed = config(json!({"approval_mode": "bypass", "tool_definitions": [
        {"type":"function","function":{"name":"deploy"},"route":{"kind":"runner","runner_executor_public_id": id, "tool_name": "deploy"}}
    ]}));
    assert_eq!(
        code(freeze(&routed, None, RunnerSelection::FirstEligible, &[runner(id, json!([visible("bash")]))], None)),
        "tool_not_served"
    );
}

#[test]
fn selection_first_eligible_named_and_none() {
    let gone = RunnerId::new_v4();
    let here = RunnerId::new_v4();
    let cfg = config(json!({"runner_executor_public_ids": [gone, here], "approval_mode": "bypass"}));
    let mut revoked = runner(gone, json!([visible("old")]));
    revoked.eligibility = Eligibility::Revoked;
    let runners = [revoked, runner(here, json!([visible("bash")]))];
    // The convenience default skips an ineligible first candidate.
    let frozen = freeze(&cfg, None, RunnerSelection::FirstEligible, &runners, None).expect("frozen");
    assert_eq!(frozen.default_runner_executor_public_id, Some(here));
    assert_eq!(frozen.tools.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(), ["bash"]);
    // An explicit null imports no Runner tools at all.
    let none = freeze(&cfg, None, RunnerSelection::NoRunner, &runners, None).expect("frozen");
    assert_eq!(none.default_runner_executor_public_id, None);
    assert!(none.tools.is_empty());
    assert_eq!(none.runner_candidates.len(), 1, "the eligible candidates are still reported");
    assert_eq!(none.runner_candidates[0]["runner_executor_public_id"], json!(here));
    // A named ineligible runner is refused, never replaced.
    let refused = freeze(&cfg, None, RunnerSelection::Named(gone), &runners, None).expect_err("refused");
    assert_eq!(refused.code, ErrorCode::RunnerNotEligible);
}

/// Whose runner is whose (`docs/protocol.md`, "Assignment"): a runner assigned to other Agents
/// is never selected, shown or routed to, and a declaration whose every candidate is ineligible
/// is refused rather than run without its runner.
#[test]
fn r28_a_runner_of_other_agents_is_never_selected_listed_or_routed_to() {
    let mine = RunnerId::new_v4();
    let theirs = RunnerId::new_v4();
    let mut foreign = runner(theirs, json!([visible("deploy")]));
    foreign.eligibility = Eligibility::NotAssigned;
    foreign.display_name = "their-secret-box".into();
    let runners = [foreign.clone(), runner(mine, json!([visible("bash")]))];
    let both = config(json!({"runner_executor_public_ids": [theirs, mine], "approval_mode": "bypass"}));
    // Named: refused, with neither the display name nor the reason it is someone else's.
    let named = freeze(&both, None, RunnerSelection::Named(theirs), &runners, None).expect_err("refused");
    assert_eq!(named.code, ErrorCode::RunnerNotEligible);
    assert!(!named.message.contains("their-secret-box"), "{}", named.message);
    // The convenience default skips it; the frozen candidates and the imports leave it out.
    let frozen = freeze(&both, None, RunnerSelection::FirstEligible, &runners, None).expect("frozen");
    assert_eq!(frozen.default_runner_executor_public_id, Some(mine));
    assert_eq!(frozen.runner_candidates.len(), 1);
    assert_eq!(frozen.runner_candidates[0]["runner_executor_public_id"], json!(mine));
    assert_eq!(frozen.tools.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(), ["bash"]);
    // Every candidate ineligible (assigned elsewhere, revoked, unknown): refused, each named.
    let mut revoked = runner(mine, json!([visible("bash")]));
    revoked.eligibility = Eligibility::Revoked;
    let unknown = RunnerId::new_v4();
    let none_left = config(json!({"runner_executor_public_ids": [theirs, mine, unknown], "approval_mode": "bypass"}));
    let refused = freeze(&none_left, None, RunnerSelection::FirstEligible, &[foreign.clone(), revoked], None)
        .expect_err("refused");
    assert_eq!(refused.code, ErrorCode::RunnerNotEligible);
    for id in [theirs, mine, unknown] {
        assert!(refused.message.contains(&id.to_string()), "{id} is named: {}", refused.message);
    }
    assert!(refused.message.contains("revoked"), "{}", refused.message);
    // No candidates at all is no refusal: nothing was declared to run on.
    let bare = freeze(&config(json!({})), None, RunnerSelection::FirstEligible, &[], None).expect("frozen");
    assert_eq!(bare.default_runner_executor_public_id, None);
    // An explicit route to it is refused as not eligible, not as an unserved tool.
    let routed = config(json!({"approval_mode": "bypass", "tool_definitions": [
        {"type":"function","function":{"name":"ship"},"route":{"kind":"runner","runner_executor_public_id": theirs, "tool_name": "deploy"}}
    ]}));
    let refused = freeze(&routed, None, RunnerSelection::NoRunner, &[foreign], None).expect_err("refused");
    assert_eq!(refused.code, ErrorCode::RunnerNotEligible);
    assert!(refused.message.starts_with("ship: "), "{}", refused.message);
}

/// Issue 13, item 7 and issue 14: the doors refuse a kernel tool this server cannot run
/// (`kernel_tool_unavailable`); every live catalog tool runs now, so each is accepted in every
/// shape, and the grammar's own words still come first.
#[test]
fn every_live_kernel_tool_is_accepted_in_every_shape() {
    let rows: Vec<(&str, Value)> = vec![
        (
            "a plain import",
            json!({"approval_mode": "bypass", "kernel_tools": ["nexus.memory.read", "nexus.graph.delegate_task"]}),
        ),
        (
            "the catalog's bytes",
            json!({"approval_mode": "bypass", "tool_definitions": [plain("first"), kernel("wait")]}),
        ),
        (
            "a compact identity entry",
            json!({"approval_mode": "bypass", "tool_definitions": [{"name": "spawn", "canonical": "nexus.conversation.spawn"}]}),
        ),
        ("an alias", json!({"approval_mode": "bypass", "tool_definitions": [plain("first"), agent_alias()]})),
    ];
    for (row, value) in rows {
        let accepted = validate_configuration(value.as_object().expect("object"), &accept_all);
        assert!(accepted.is_ok(), "{row}: {:?}", accepted.err());
    }
    let message = validate_configuration(
        json!({"approval_mode": "bypass", "tool_definitions": [plain("Agent"), agent_alias()]})
            .as_object()
            .expect("object"),
        &accept_all,
    )
    .expect_err("refused")
    .message;
    assert!(message.contains("duplicate_tool_name"), "{message}");
    let served: Vec<&str> = nexus_kernel_tools::SERVED.to_vec();
    assert_eq!(served.len(), nexus_kernel_tools::CATALOG.len(), "every live tool is served");
    let stored = config(json!({"approval_mode": "bypass", "kernel_tools": served}));
    assert_eq!(stored["kernel_tools"].as_array().map(Vec::len), Some(20));
    let bytes: Vec<Value> =
        served.iter().map(|name| nexus_kernel_tools::live(name).expect("live").definition().clone()).collect();
    config(json!({"approval_mode": "bypass", "tool_definitions": bytes}));
}
