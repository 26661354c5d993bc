//! Memory (`docs/kernel-tools.md`, "memory"), end to end through the scripted model: the six
//! memory tools over the three roots, the effective context under a limit, revisions that record
//! their task, concurrent writers, the doors, and a SIGKILL of the real binary.

use std::time::Duration;

use serde_json::{Value, json};

use nexus_actors::memory::{MemoryRoot, MemoryScope};
use nexus_proto::{ExecutionId, GrantRole, RunStatus};
use nexus_tests::{Http, Minted, TestServer, wait_until};

const WAIT: Duration = Duration::from_secs(30);

/// The six memory tools by canonical name.
const MEMORY_TOOLS: [&str; 6] = [
    "nexus.memory.read",
    "nexus.memory.write",
    "nexus.memory.edit",
    "nexus.memory.ls",
    "nexus.memory.grep",
    "nexus.memory.delete",
];

fn call(id: &str, name: &str, arguments: Value) -> Value {
    json!({"id": id, "name": name, "arguments": arguments})
}

/// A script of tool rounds (each a list of calls) and a final text.
fn script(rounds: Vec<Vec<Value>>, last: &str) -> Value {
    let mut all: Vec<Value> = rounds.into_iter().map(|calls| json!({"tool_calls": calls})).collect();
    all.push(json!({"final": last}));
    json!({"rounds": all})
}

/// The inline declaration of a turn answered by `scripted/<model>` with the memory tools.
fn declaration(model: &str, limit: Option<Value>) -> Value {
    let mut declaration = json!({"default_model": format!("scripted/{model}"), "approval_mode": "bypass",
                                 "kernel_tools": MEMORY_TOOLS});
    if let Some(limit) = limit {
        declaration["memory_context_limit"] = limit;
    }
    declaration
}

pub(crate) struct Bed {
    pub(crate) server: TestServer,
    pub(crate) agent: Minted,
    pub(crate) http: Http,
}

impl Bed {
    pub(crate) async fn start(scripts: &[(&str, Value)]) -> Bed {
        let server = TestServer::start(scripts).await;
        let agent = server.agent("mnemo").await;
        let http = Http::new(&server.url(), Some(&agent.token));
        Bed { server, agent, http }
    }

    /// Posts one turn (in `conversation`, else a new one) and answers (conversation, execution).
    pub(crate) async fn post(&self, conversation: Option<&str>, declaration: &Value) -> (String, ExecutionId) {
        let mut body = json!({"text": "go", "execution_declaration": declaration});
        if let Some(conversation) = conversation {
            body["conversation_public_id"] = json!(conversation);
        }
        let admitted = self.http.post("/agent_api/v1/inputs", &body).await;
        assert_eq!(admitted.status, 201, "{:?}", admitted.body);
        let conversation = admitted.body["conversation_public_id"].as_str().expect("conversation").to_owned();
        let id = admitted.body["execution_public_id"].as_str().and_then(|s| s.parse().ok()).expect("execution");
        (conversation, id)
    }

    /// Posts one turn and answers its conversation and the final text the model wrote.
    pub(crate) async fn turn(&self, conversation: Option<&str>, declaration: &Value) -> (String, String) {
        let (conversation, id) = self.post(conversation, declaration).await;
        let row = self.server.settled(id, WAIT).await;
        assert_eq!(row.status, RunStatus::Completed, "{row:?}");
        (conversation, row.final_text.unwrap_or_default())
    }

    fn workspace(&self) -> MemoryRoot {
        MemoryRoot {
            agent_public_id: self.agent.member(),
            scope: MemoryScope::Workspace,
            owner_public_id: self.agent.member().uuid(),
        }
    }
}

#[tokio::test]
async fn a_conversation_document_is_read_back_next_turn_and_not_from_another_conversation() {
    let write = script(
        vec![vec![call("w", "memory_write", json!({"path": "conversation/notes.md", "content": "alpha\nbeta\n"}))]],
        "wrote revision {{tool:w.revision}}",
    );
    let read = script(
        vec![vec![call("r", "memory_read", json!({"path": "conversation/notes.md", "offset": 2, "limit": 1}))]],
        "read {{tool:r.content}}",
    );
    let bed = Bed::start(&[("write", write), ("read", read)]).await;
    let (conversation, wrote) = bed.turn(None, &declaration("write", None)).await;
    assert_eq!(wrote, "wrote revision 1");
    let (_, read_back) = bed.turn(Some(&conversation), &declaration("read", None)).await;
    assert_eq!(read_back, "read beta", "the model read line 2 of what turn 1 wrote");
    let (other, elsewhere) = bed.turn(None, &declaration("read", None)).await;
    assert_ne!(other, conversation);
    assert!(elsewhere.starts_with("read memory_not_found:"), "{elsewhere}");
}

#[tokio::test]
async fn a_workspace_document_is_shared_by_the_agents_conversations() {
    let write = script(
        vec![vec![call("w", "memory_write", json!({"path": "workspace/plan.md", "content": "ship on friday"}))]],
        "ok {{tool:w.bytes}}",
    );
    let read = script(vec![vec![call("r", "memory_read", json!({"path": "workspace/plan.md"}))]], "{{tool:r.content}}");
    let bed = Bed::start(&[("write", write), ("read", read)]).await;
    let (first, wrote) = bed.turn(None, &declaration("write", None)).await;
    assert_eq!(wrote, "ok 14");
    let (second, read) = bed.turn(None, &declaration("read", None)).await;
    assert_ne!(first, second);
    assert_eq!(read, "ship on friday");
    let history = bed.server.store().memory_revisions(&bed.workspace(), "plan.md").await.expect("history");
    assert_eq!(history.len(), 1);
    assert_eq!(history[0].task_key.map(|k| k.to_string()).as_deref(), Some("r1t0"), "the revision names its task");
    assert!(history[0].execution_public_id.is_some() && history[0].member_public_id.is_none());
}

#[tokio::test]
async fn a_write_under_a_read_only_limit_is_refused_and_stores_nothing() {
    let write = script(
        vec![vec![
            call("w", "memory_write", json!({"path": "workspace/plan.md", "content": "x"})),
            call("s", "memory_write", json!({"path": "speaker/prefs.md", "content": "x"})),
        ]],
        "{{tool:w}} | {{tool:s}}",
    );
    let bed = Bed::start(&[("write", write)]).await;
    let limit = json!({"bindings": [
        {"name": "conversation", "scope": "conversation", "access": "read_write"},
        {"name": "workspace", "scope": "workspace", "access": "read"},
    ]});
    let (_, answer) = bed.turn(None, &declaration("write", Some(limit))).await;
    let (workspace, speaker) = answer.split_once(" | ").expect("two results");
    assert!(workspace.starts_with("memory_read_only: workspace/ is read-only"), "{workspace}");
    assert!(workspace.contains("memory_context_limit"), "the message says why: {workspace}");
    // The Agent posted the input itself: there is no speaker root.
    assert!(speaker.starts_with("memory_scope_unavailable:"), "{speaker}");
    let stored = bed.server.store().memory_document(&bed.workspace(), "plan.md").await.expect("read");
    assert_eq!(stored, None, "nothing was stored");
    let door = bed.http.get("/agent_api/v1/memory/workspace/plan.md").await;
    assert_eq!((door.status, door.code()), (404, Some("memory_not_found")), "{:?}", door.body);
}

#[tokio::test]
async fn edit_ls_grep_and_delete_each_do_what_they_say() {
    let tools = script(
        vec![
            vec![call("w", "memory_write", json!({"path": "workspace/todo.md", "content": "one\ntwo\none more\n"}))],
            vec![
                call(
                    "missing",
                    "memory_edit",
                    json!({"path": "workspace/todo.md", "old_text": "three", "new_text": "3"}),
                ),
                call("twice", "memory_edit", json!({"path": "workspace/todo.md", "old_text": "one", "new_text": "1"})),
            ],
            vec![call("e", "memory_edit", json!({"path": "workspace/todo.md", "old_text": "two", "new_text": "TWO"}))],
            vec![
                call("l", "memory_ls", json!({"path": "workspace/"})),
                call("g", "memory_grep", json!({"pattern": "^t.o$", "ignore_case": true})),
                call("reserved", "memory_read", json!({"path": "workspace/skills/x.md"})),
                call("bad", "memory_read", json!({"path": "workspace/../x"})),
            ],
            vec![call("d", "memory_delete", json!({"path": "workspace/todo.md"}))],
            vec![call("gone", "memory_read", json!({"path": "workspace/todo.md"}))],
        ],
        "{{tool:missing}}\n{{tool:twice}}\n{{tool:e.revision}}\n{{tool:l}}\n{{tool:g}}\n{{tool:reserved}}\n{{tool:bad}}\n{{tool:d.deleted}}\n{{tool:gone}}",
    );
    let bed = Bed::start(&[("tools", tools)]).await;
    let (_, answer) = bed.turn(None, &declaration("tools", None)).await;
    let lines: Vec<&str> = answer.lines().collect();
    assert_eq!(lines.len(), 9, "{answer}");
    assert!(lines[0].starts_with("memory_edit_no_match:"), "{}", lines[0]);
    assert!(lines[1].starts_with("memory_edit_ambiguous:"), "{}", lines[1]);
    assert_eq!(lines[2], "2", "only the exact edit wrote a revision");
    let listed: Value = serde_json::from_str(lines[3]).expect("ls json");
    assert_eq!(listed["documents"][0]["path"], "workspace/todo.md", "{listed}");
    assert_eq!(listed["documents"][0]["revision"], 2);
    assert_eq!(listed["documents"][0]["bytes"], 17);
    let found: Value = serde_json::from_str(lines[4]).expect("grep json");
    assert_eq!(found["matches"], json!([{"path": "workspace/todo.md", "line": 2, "text": "TWO"}]), "{found}");
    assert!(lines[5].starts_with("memory_reserved_prefix:"), "{}", lines[5]);
    assert!(lines[6].starts_with("memory_path_invalid:"), "{}", lines[6]);
    assert_eq!(lines[7], "true");
    assert!(lines[8].starts_with("memory_not_found:"), "{}", lines[8]);
    let history = bed.server.store().memory_revisions(&bed.workspace(), "todo.md").await.expect("history");
    let kinds: Vec<(i64, Option<&str>)> = history.iter().map(|r| (r.revision, r.content.as_deref())).collect();
    assert_eq!(kinds, [(1, Some("one\ntwo\none more\n")), (2, Some("one\nTWO\none more\n")), (3, None)]);
}

#[tokio::test]
async fn two_executions_writing_one_document_concurrently_leave_both_revisions() {
    let a = script(
        vec![vec![call("w", "memory_write", json!({"path": "workspace/shared.md", "content": "from a"}))]],
        "{{tool:w.revision}}",
    );
    let b = script(
        vec![vec![call("w", "memory_write", json!({"path": "workspace/shared.md", "content": "from b"}))]],
        "{{tool:w.revision}}",
    );
    let bed = Bed::start(&[("a", a), ("b", b)]).await;
    let (_, first) = bed.post(None, &declaration("a", None)).await;
    let (_, second) = bed.post(None, &declaration("b", None)).await;
    let one = bed.server.settled(first, WAIT).await;
    let two = bed.server.settled(second, WAIT).await;
    let mut revisions = vec![one.final_text.unwrap_or_default(), two.final_text.unwrap_or_default()];
    revisions.sort();
    assert_eq!(revisions, ["1", "2"], "the writes serialized");
    let history = bed.server.store().memory_revisions(&bed.workspace(), "shared.md").await.expect("history");
    let mut contents: Vec<&str> = history.iter().filter_map(|r| r.content.as_deref()).collect();
    contents.sort_unstable();
    assert_eq!(contents, ["from a", "from b"], "neither write was lost");
    let writers: std::collections::HashSet<ExecutionId> =
        history.iter().filter_map(|r| r.execution_public_id).collect();
    assert_eq!(writers, [first, second].into_iter().collect());
}

#[tokio::test]
async fn the_doors_put_get_list_delete_conditionally_and_judge_who_asks() {
    let bed = Bed::start(&[]).await;
    let doc = "/agent_api/v1/memory/workspace/plan.md";
    let created = bed.http.put(doc, &json!({"content": "v1", "expected_revision": null})).await;
    assert_eq!(created.status, 201, "{:?}", created.body);
    assert_eq!(created.body["revision"], 1);
    let again = bed.http.put(doc, &json!({"content": "v1", "expected_revision": null})).await;
    assert_eq!((again.status, again.code()), (409, Some("stale_object")));
    let stale = bed.http.put(doc, &json!({"content": "v2", "expected_revision": 7})).await;
    assert_eq!((stale.status, stale.code()), (409, Some("stale_object")));
    let updated = bed.http.put(doc, &json!({"content": "v2", "expected_revision": 1})).await;
    assert_eq!((updated.status, updated.body["revision"].clone()), (200, json!(2)), "{:?}", updated.body);
    let read = bed.http.get(doc).await;
    assert_eq!((read.body["content"].as_str(), read.body["revision"].as_i64()), (Some("v2"), Some(2)));
    for (body, code) in [
        (json!({"content": "x"}), "parameter_missing"),
        (json!({"content": 1, "expected_revision": null}), "parameter_invalid"),
        (json!({"content": "x", "expected_revision": 2, "extra": 1}), "parameter_invalid"),
    ] {
        let refused = bed.http.put(doc, &body).await;
        assert_eq!((refused.status, refused.code()), (400, Some(code)), "{body}");
    }
    let bad =
        bed.http.put("/agent_api/v1/memory/workspace/a%20b", &json!({"content": "x", "expected_revision": null})).await;
    assert_eq!((bad.status, bad.code()), (422, Some("memory_path_invalid")), "{:?}", bad.body);
    let unknown = bed.http.get("/agent_api/v1/memory/team/x.md").await;
    assert_eq!((unknown.status, unknown.code()), (422, Some("memory_scope_unavailable")));
    let no_conversation = bed.http.get("/agent_api/v1/memory/conversation/x.md").await;
    assert_eq!((no_conversation.status, no_conversation.code()), (400, Some("parameter_missing")));
    let listed = bed.http.get("/agent_api/v1/memory?binding=workspace").await;
    assert_eq!(listed.body["documents"][0]["path"], "plan.md", "{:?}", listed.body);
    let history = bed.http.get(&format!("{doc}?revisions=true")).await;
    let revisions = history.body["revisions"].as_array().expect("revisions");
    assert_eq!(revisions.len(), 2);
    assert_eq!(revisions[1]["member_public_id"], json!(bed.agent.id), "a door write names its member");

    // A viewer reads but cannot write; a steward writes; another Agent sees nothing.
    let viewer = bed.server.human("vera").await;
    let steward = bed.server.human("stan").await;
    let store = bed.server.store();
    nexus_actors::cli::admin::grants::grant(store, viewer.member(), bed.agent.member(), GrantRole::Viewer)
        .await
        .expect("viewer");
    nexus_actors::cli::admin::grants::grant(store, steward.member(), bed.agent.member(), GrantRole::Steward)
        .await
        .expect("steward");
    let as_viewer = Http::new(&bed.server.url(), Some(&viewer.token));
    let named = format!("{doc}?agent_public_id={}", bed.agent.id);
    assert_eq!(as_viewer.get(&named).await.body["content"], "v2");
    let refused = as_viewer.put(&named, &json!({"content": "v3", "expected_revision": 2})).await;
    assert_eq!((refused.status, refused.code()), (403, Some("not_authorized")));
    let as_steward = Http::new(&bed.server.url(), Some(&steward.token));
    let wrote = as_steward.put(&named, &json!({"content": "v3", "expected_revision": 2})).await;
    assert_eq!(wrote.status, 200, "{:?}", wrote.body);
    let mine = format!("/agent_api/v1/memory/speaker/prefs.md?agent_public_id={}", bed.agent.id);
    assert_eq!(as_steward.put(&mine, &json!({"content": "tea", "expected_revision": null})).await.status, 201);
    assert_eq!(as_viewer.get(&mine).await.code(), Some("memory_not_found"), "a speaker's memory is their own");
    let other = bed.server.agent("other").await;
    let as_other = Http::new(&bed.server.url(), Some(&other.token));
    assert_eq!(as_other.get(doc).await.code(), Some("memory_not_found"), "its own workspace holds nothing");
    let across = as_other.get(&named).await;
    assert_eq!((across.status, across.code()), (404, Some("not_found")));

    let deleted = bed.http.delete(doc).await;
    assert_eq!((deleted.status, deleted.body["deleted"].clone()), (200, json!(true)), "{:?}", deleted.body);
    assert_eq!(bed.http.get(doc).await.code(), Some("memory_not_found"));
    assert_eq!(bed.http.delete(doc).await.code(), Some("memory_not_found"));
    let history = bed.http.get(&format!("{doc}?revisions=true")).await;
    assert_eq!(history.body["revisions"][3]["deleted"], true, "{:?}", history.body);

    // The profile's limit applies to the doors.
    let declared = bed
        .http
        .declare(&json!({"configuration": {"memory_context_limit": {"bindings": [
            {"name": "conversation", "scope": "conversation", "access": "read_write"},
            {"name": "workspace", "scope": "workspace", "access": "read"}]}}}))
        .await;
    assert_eq!(declared.status, 200, "{:?}", declared.body);
    let read_only = bed.http.put(doc, &json!({"content": "v", "expected_revision": null})).await;
    assert_eq!((read_only.status, read_only.code()), (403, Some("memory_read_only")), "{:?}", read_only.body);
    let outside = as_steward.get(&mine).await;
    assert_eq!((outside.status, outside.code()), (422, Some("memory_scope_unavailable")));
}

/// Memory survives a SIGKILL of the real binary: a document the model wrote is read through the
/// door after the restart.
#[tokio::test]
async fn memory_survives_a_sigkill() {
    use nexus_actors::store::StoreBackend;
    use nexus_tests::processes::{NexusProcess, StoreLocation, admin_agent, free_loopback_addr};
    use nexus_tests::{Act, FakeProvider};
    use nexus_tests::{TestDatabase, test_store_backend};

    let fake = FakeProvider::start().await;
    let arguments = json!({"path": "workspace/kept.md", "content": "durable"});
    fake.script(
        "keep",
        [Act::ToolCalls(vec![("k_1".into(), "memory_write".into(), arguments)]), Act::Text("done".into())],
    );
    let dir = tempfile::tempdir().expect("dir");
    let data_dir = dir.path().join("data");
    std::fs::create_dir(&data_dir).expect("data dir");
    let database = match test_store_backend() {
        StoreBackend::Postgres => Some(TestDatabase::create().await),
        _ => None,
    };
    let at = StoreLocation { data_dir, database_url: database.as_ref().map(|d| d.url().to_owned()) };
    let config = dir.path().join("nexus.toml");
    let toml = format!(
        "[providers.oa]\nkind = \"openai_compatible\"\nbase_url = {:?}\nallow_any_model = true\n",
        fake.openai_base_url()
    );
    std::fs::write(&config, toml).expect("config");
    let addr = free_loopback_addr();
    let nexus = NexusProcess::serve(&at, addr, &config).await;
    let agent = admin_agent(&at, "ada").await;
    let http = Http::new(&nexus.url(), Some(&agent.token));
    let declaration = json!({"approval_mode": "bypass", "default_model": "oa/keep", "kernel_tools": MEMORY_TOOLS});
    let first = http.post("/agent_api/v1/inputs", &json!({"text": "keep", "execution_declaration": declaration})).await;
    assert_eq!(first.status, 201, "{:?}", first.body);
    let execution = first.body["execution_public_id"].as_str().expect("execution").to_owned();
    wait_until("the execution to settle", WAIT, || async {
        let row = http.get(&format!("/agent_api/v1/executions/{execution}")).await;
        matches!(row.body["status"].as_str(), Some("completed")).then_some(())
    })
    .await;
    nexus.sigkill().await;
    let nexus = NexusProcess::serve(&at, addr, &config).await;
    let read = http.get("/agent_api/v1/memory/workspace/kept.md").await;
    assert_eq!((read.status, read.body["content"].as_str()), (200, Some("durable")), "{:?}", read.body);
    assert_eq!(read.body["revision"], 1);
    drop(nexus);
}

#[tokio::test]
async fn the_memory_block_lists_the_context_and_a_workspace_skill_is_listed_and_loaded() {
    use nexus_tests::{Act, FakeProvider};
    let fake = FakeProvider::start().await;
    let server = TestServer::start_with_fake(&fake).await;
    let agent = server.agent("mnemo").await;
    let http = Http::new(&server.url(), Some(&agent.token));
    // People write skills and documents through the doors; the model's memory verbs never reach
    // `skills/`.
    let skill =
        "---\nname: triage\ndescription: Sort incoming bugs by severity\n---\n# Triage\nRead the report first.\n";
    for (path, content) in [("skills/triage.md", skill), ("plan.md", "ship on friday")] {
        let put = http
            .put(
                &format!("/agent_api/v1/memory/workspace/{path}"),
                &json!({"content": content, "expected_revision": null}),
            )
            .await;
        assert_eq!(put.status, 201, "{:?}", put.body);
    }
    let calls = |calls: &[(&str, &str, Value)]| {
        Act::ToolCalls(
            calls.iter().map(|(id, name, input)| ((*id).to_owned(), (*name).to_owned(), input.clone())).collect(),
        )
    };
    fake.script(
        "load",
        vec![
            calls(&[("s", "skill", json!({"name": "triage"})), ("u", "skill", json!({"name": "nope"}))]),
            Act::Text("done".into()),
        ],
    );
    let mut declared = json!({"default_model": "fake/load", "approval_mode": "bypass", "kernel_tools": MEMORY_TOOLS});
    declared["kernel_tools"].as_array_mut().expect("list").push(json!("nexus.skill.load"));
    let admitted = http.post("/agent_api/v1/inputs", &json!({"text": "go", "execution_declaration": declared})).await;
    assert_eq!(admitted.status, 201, "{:?}", admitted.body);
    let id: ExecutionId = admitted.body["execution_public_id"].as_str().and_then(|s| s.parse().ok()).expect("id");
    let row = server.settled(id, WAIT).await;
    assert_eq!(row.status, RunStatus::Completed, "{row:?}");

    let requests = fake.requests_for("load");
    let messages = |index: usize| requests[index].body["messages"].as_array().cloned().unwrap_or_default();
    let text_of = |m: &Value| match &m["content"] {
        Value::String(text) => text.clone(),
        Value::Array(parts) => parts.iter().filter_map(|p| p["text"].as_str()).collect::<Vec<_>>().join("\n"),
        _ => String::new(),
    };
    let documents: String = messages(0).iter().filter(|m| m["role"] == "system").map(text_of).collect();
    assert!(documents.contains("Memory you can reach now"), "{documents}");
    assert!(
        documents.contains("- workspace/ (read_write)") && documents.contains("- conversation/ (read_write)"),
        "{documents}"
    );
    assert!(documents.contains("- workspace/plan.md (14 bytes)"), "{documents}");
    assert!(!documents.contains("workspace/skills/"), "the skills block lists those: {documents}");
    assert!(
        documents.contains("Skills available now.") && documents.contains("- triage: Sort incoming bugs by severity"),
        "{documents}"
    );
    let results: Vec<String> = messages(1).iter().filter(|m| m["role"] == "tool").map(text_of).collect();
    assert_eq!(results, [skill.to_owned(), "skill_unknown: nope".to_owned()], "the model read the document whole");

    // Without a memory tool the block is left out.
    fake.script("bare", vec![Act::Text("done".into())]);
    let bare = json!({"default_model": "fake/bare", "approval_mode": "bypass", "kernel_tools": ["nexus.skill.load"]});
    let admitted = http.post("/agent_api/v1/inputs", &json!({"text": "go", "execution_declaration": bare})).await;
    let id: ExecutionId = admitted.body["execution_public_id"].as_str().and_then(|s| s.parse().ok()).expect("id");
    server.settled(id, WAIT).await;
    let bare_documents: String = fake.requests_for("bare")[0].body["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["role"] == "system")
        .map(text_of)
        .collect();
    assert!(!bare_documents.contains("Memory you can reach now"), "{bare_documents}");
    assert!(bare_documents.contains("- triage:"), "the skills block still lists the workspace skill: {bare_documents}");
}
