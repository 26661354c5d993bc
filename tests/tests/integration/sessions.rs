//! The history kernel tools end to end (`docs/kernel-tools.md`, "session_search and
//! session_read"): a fake OpenAI-compatible model calls `session_search` and `session_read`, and
//! each test asserts what the model read back (the tool results its next request carried): the
//! Agent's other conversations are found and read, another Agent's never, `subtree` keeps to the
//! current conversation, pages follow their cursors, the 12,000-character bound cuts a long turn
//! and says so, and bad input reads as call error envelopes.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Value, json};

use nexus_actors::actors::execution::sessions;
use nexus_actors::doors::api::{Admitted, CreateInput};
use nexus_actors::store::Reachable;
use nexus_proto::{ConversationId, InputId, RunStatus};
use nexus_tests::{Act, FakeProvider, FakeRequest, Minted, TestServer};

const SETTLE: Duration = Duration::from_secs(30);

/// A server whose `fake` provider is a [`FakeProvider`], with two Agents.
struct Bed {
    fake: FakeProvider,
    server: TestServer,
    ada: Minted,
    bob: Minted,
}

impl Bed {
    async fn start() -> Bed {
        let fake = FakeProvider::start().await;
        let server = TestServer::start_with_fake(&fake).await;
        let ada = server.agent("ada").await;
        let bob = server.agent("bob").await;
        Bed { fake, server, ada, bob }
    }

    /// Queues `acts` for `model`, posts `text` for `agent` (continuing `conversation` when given)
    /// declared on `fake/<model>` with both history tools and `reach`, and waits for it to
    /// complete.
    async fn turn(
        &self,
        agent: &Minted,
        conversation: Option<ConversationId>,
        text: &str,
        model: &str,
        reach: Value,
        acts: Vec<Act>,
    ) -> Admitted {
        self.fake.script(model, acts);
        let caller = self.server.caller(agent).await;
        let declaration = json!({
            "approval_mode": "bypass",
            "default_model": format!("fake/{model}"),
            "kernel_tools": ["nexus.conversation.search", "nexus.conversation.read"],
            "conversation_reach": reach,
        });
        let input = CreateInput {
            conversation_public_id: conversation,
            text: text.to_owned(),
            execution_declaration: Some(declaration),
            ..CreateInput::default()
        };
        let admitted = self.server.server.api.create_input(&caller, input).await.expect("admitted");
        let row = self.server.settled(admitted.execution_public_id, SETTLE).await;
        assert_eq!(row.status, RunStatus::Completed, "{text}: {row:?}");
        admitted
    }

    /// A plain turn: the model answers `answer` at once.
    async fn say(&self, agent: &Minted, conversation: Option<ConversationId>, text: &str, answer: &str) -> Admitted {
        self.turn(agent, conversation, text, "plain", Value::Null, vec![Act::Text(answer.into())]).await
    }

    /// The tool results `model`'s last request carried, by call id.
    fn read(&self, model: &str) -> BTreeMap<String, String> {
        let requests = self.fake.requests_for(model);
        requests.last().map(results).unwrap_or_default()
    }
}

fn results(request: &FakeRequest) -> BTreeMap<String, String> {
    request.body["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["role"] == "tool")
        .map(|m| {
            (
                m["tool_call_id"].as_str().unwrap_or_default().to_owned(),
                m["content"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

fn calls(calls: &[(&str, &str, Value)]) -> Act {
    Act::ToolCalls(
        calls.iter().map(|(id, name, input)| ((*id).to_owned(), (*name).to_owned(), input.clone())).collect(),
    )
}

fn parsed(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| panic!("a JSON result, read {text:?}"))
}

#[tokio::test]
async fn search_finds_the_agents_other_conversations_never_another_agents_and_subtree_keeps_home() {
    let bed = Bed::start().await;
    let a1 = bed.say(&bed.ada, None, "the Zebra crossing plan", "noted").await;
    let x1 = bed.say(&bed.bob, None, "zebra secret of bob", "noted").await;

    // From another conversation of ada: her turn, not bob's, not the calling turn itself.
    let search = |id: &str, input: Value| vec![calls(&[(id, "session_search", input)]), Act::Text("done".into())];
    let b1 = bed
        .turn(&bed.ada, None, "find the zebra notes", "search_b", Value::Null, search("s", json!({"query": "ZEBRA"})))
        .await;
    let read = &bed.read("search_b")["s"];
    assert!(!read.contains(&x1.conversation_public_id.to_string()), "bob's conversation never shows: {read}");
    let found = parsed(read);
    assert_eq!(found["next"], Value::Null);
    assert_eq!(
        found["results"],
        json!([{"session_id": a1.conversation_public_id, "turn_id": a1.input_public_id, "position": 1,
                "created_at": found["results"][0]["created_at"], "matched": "input",
                "snippet": "the Zebra crossing plan"}])
    );

    // subtree: only the current conversation's turns (b1 matches too, outside the subtree).
    let a2 = bed
        .turn(
            &bed.ada,
            Some(a1.conversation_public_id),
            "search here only",
            "search_a",
            json!("subtree"),
            search("s", json!({"query": "zebra"})),
        )
        .await;
    let found = parsed(&bed.read("search_a")["s"]);
    let hits: Vec<(Value, Value)> = found["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(|r| (r["session_id"].clone(), r["turn_id"].clone()))
        .collect();
    assert_eq!(hits, [(json!(a1.conversation_public_id), json!(a1.input_public_id))]);

    // workspace, newest first, one a page: b1 then (through the cursor) a1.
    let c1 = bed
        .turn(
            &bed.ada,
            None,
            "and again",
            "search_c",
            json!("workspace"),
            search("s", json!({"query": "zebra", "limit": 1})),
        )
        .await;
    let first = parsed(&bed.read("search_c")["s"]);
    assert_eq!(first["results"][0]["turn_id"], json!(b1.input_public_id), "{first}");
    assert_eq!(first["results"][0]["snippet"], "find the zebra notes");
    let next = first["next"].as_str().expect("a next cursor").to_owned();
    let reach = Reachable { agent: bed.ada.member(), within: None };
    let input = json!({"query": "zebra", "limit": 1, "after": next});
    let second = sessions::search(bed.server.store(), &reach, c1.input_public_id, &input).await.expect("store");
    let second = second.expect("a result");
    assert_eq!(second["results"][0]["turn_id"], json!(a1.input_public_id), "{second}");
    assert_eq!(second["next"], Value::Null);
    assert_ne!(a2.input_public_id, a1.input_public_id);

    // `archived: only` finds none: nothing is archived here.
    let only = json!({"query": "zebra", "archived": "only"});
    let none = sessions::search(bed.server.store(), &reach, c1.input_public_id, &only).await.expect("store");
    assert_eq!(none.expect("a result"), json!({"results": [], "next": null}));
}

#[tokio::test]
async fn read_pages_a_conversation_and_refuses_what_it_cannot_reach_alike() {
    let bed = Bed::start().await;
    let t1 = bed.say(&bed.ada, None, "turn one", "answer one").await;
    let conversation = t1.conversation_public_id;
    let t2 = bed.say(&bed.ada, Some(conversation), "turn two", "answer two").await;
    let t3 = bed.say(&bed.ada, Some(conversation), "turn three", "answer three").await;
    let bobs = bed.say(&bed.bob, None, "bob's own", "noted").await.conversation_public_id;
    let nowhere = ConversationId::new_v4();

    let acts = vec![
        calls(&[("r1", "session_read", json!({"session_id": conversation, "limit": 2}))]),
        calls(&[("r2", "session_read", json!({"session_id": conversation, "limit": 2, "after_position": 2}))]),
        calls(&[
            ("r3", "session_read", json!({"session_id": nowhere})),
            ("r4", "session_read", json!({"session_id": bobs})),
            (
                "r5",
                "session_read",
                json!({"session_id": conversation, "around_turn_id": t2.input_public_id, "limit": 1}),
            ),
            ("r6", "session_read", json!({"session_id": conversation, "before_position": 3, "limit": 1})),
        ]),
        Act::Text("done".into()),
    ];
    bed.turn(&bed.ada, None, "read it back", "reader", Value::Null, acts).await;
    let read = bed.read("reader");

    let first = parsed(&read["r1"]);
    assert_eq!(
        first,
        json!({"session_id": conversation, "turn_count": 3, "next_after_position": 2, "previous_before_position": null,
        "turns": [
            {"position": 1, "turn_id": t1.input_public_id, "input": "turn one", "answer": "answer one", "status": "completed"},
            {"position": 2, "turn_id": t2.input_public_id, "input": "turn two", "answer": "answer two", "status": "completed"},
        ]})
    );
    // The second call followed the first's cursor.
    let second = parsed(&read["r2"]);
    let positions = |page: &Value| -> Vec<Value> {
        page["turns"].as_array().expect("turns").iter().map(|t| t["position"].clone()).collect()
    };
    assert_eq!(positions(&second), [json!(3)]);
    assert_eq!(second["turns"][0]["turn_id"], json!(t3.input_public_id));
    assert_eq!(
        (second["next_after_position"].clone(), second["previous_before_position"].clone()),
        (Value::Null, json!(3))
    );
    assert_eq!(positions(&parsed(&read["r5"])), [json!(2)], "around_turn_id centers the page");
    assert_eq!(positions(&parsed(&read["r6"])), [json!(2)], "before_position reads the newest before it");

    // Another Agent's conversation reads exactly as one that does not exist.
    assert!(read["r3"].starts_with("unknown_conversation:"), "{}", read["r3"]);
    assert_eq!(read["r4"], read["r3"].replace(&nowhere.to_string(), &bobs.to_string()));
}

#[tokio::test]
async fn read_holds_twelve_thousand_characters_and_cuts_a_long_turn_saying_so() {
    let bed = Bed::start().await;
    let small = bed.say(&bed.ada, None, "short one", "ok").await;
    let conversation = small.conversation_public_id;
    let long_input = "L".repeat(9_000);
    let long_answer = "M".repeat(5_000);
    bed.say(&bed.ada, Some(conversation), &long_input, &long_answer).await;
    bed.say(&bed.ada, Some(conversation), "short three", "ok").await;

    let acts = vec![
        calls(&[
            ("all", "session_read", json!({"session_id": conversation, "limit": 50})),
            ("long", "session_read", json!({"session_id": conversation, "after_position": 1})),
        ]),
        Act::Text("done".into()),
    ];
    bed.turn(&bed.ada, None, "read the long one", "long_reader", Value::Null, acts).await;
    let read = bed.read("long_reader");
    let chars = |page: &Value| -> usize {
        page["turns"]
            .as_array()
            .expect("turns")
            .iter()
            .map(|t| {
                t["input"].as_str().unwrap_or_default().chars().count()
                    + t["answer"].as_str().unwrap_or_default().chars().count()
            })
            .sum()
    };

    // The page ends before the turn that does not fit; its cursor leads there.
    let all = parsed(&read["all"]);
    assert_eq!(all["turns"].as_array().map(Vec::len), Some(1), "{all}");
    assert_eq!(all["next_after_position"], 1);
    // Alone on its page, the long turn is cut to the bound and says so.
    let long = parsed(&read["long"]);
    let turn = &long["turns"][0];
    assert_eq!((turn["position"].clone(), turn["cut"].clone()), (json!(2), json!(true)), "{long}");
    assert_eq!((turn["input_chars"].clone(), turn["answer_chars"].clone()), (json!(9_000), json!(5_000)));
    assert_eq!(turn["input"].as_str().map(str::len), Some(9_000));
    assert_eq!(turn["answer"].as_str().map(str::len), Some(3_000));
    assert_eq!(chars(&long), 12_000);
    assert_eq!(long["next_after_position"], 2);
}

#[tokio::test]
async fn bad_input_reads_as_call_error_envelopes() {
    let bed = Bed::start().await;
    let home = bed.say(&bed.ada, None, "anything", "ok").await.conversation_public_id;
    let acts = vec![
        calls(&[
            ("long", "session_search", json!({"query": "q".repeat(1025)})),
            ("zero", "session_search", json!({"query": "a", "limit": 0})),
            ("many", "session_search", json!({"query": "a", "limit": 51})),
            ("none", "session_search", json!({})),
            ("odd", "session_search", json!({"query": "a", "archived": "sometimes"})),
            ("cursor", "session_search", json!({"query": "a", "after": "yesterday"})),
            ("read0", "session_read", json!({"session_id": home, "limit": 0})),
            ("read51", "session_read", json!({"session_id": home, "limit": 51})),
            ("negative", "session_read", json!({"session_id": home, "after_position": -1})),
            ("noid", "session_read", json!({})),
            ("typo", "session_read", json!({"session_id": home, "limt": 2})),
        ]),
        Act::Text("done".into()),
    ];
    bed.turn(&bed.ada, None, "try everything", "bad", Value::Null, acts).await;
    let read = bed.read("bad");
    let word = |id: &str| read[id].split(':').next().unwrap_or_default().to_owned();
    assert_eq!(word("long"), "query_too_long", "{}", read["long"]);
    for id in ["zero", "many", "odd", "cursor", "read0", "read51", "negative", "typo"] {
        assert_eq!(word(id), "parameter_invalid", "{id}: {}", read[id]);
    }
    for id in ["none", "noid"] {
        assert_eq!(word(id), "parameter_missing", "{id}: {}", read[id]);
    }
    // A query of exactly 1024 bytes is taken.
    let reach = Reachable { agent: bed.ada.member(), within: None };
    let input = json!({"query": "q".repeat(1024)});
    let taken = sessions::search(bed.server.store(), &reach, InputId::new_v4(), &input).await;
    assert_eq!(taken.expect("store").expect("a result")["results"], json!([]));
}
