//! The conformance suite of the Agent configuration door: one test per requirement of
//! spec/REFERENCE.md section 19 that concerns declaration, validation, storage or assembly,
//! driving the real HTTP doors. Tests assert status codes and refusal words, never message text
//! beyond the field a message must name.

use serde_json::{Value, json};

use nexus_tests::{Answer, Http, Minted, TestServer};

/// A server with one Agent and its HTTP client.
struct Door {
    server: TestServer,
    agent: Minted,
    http: Http,
}

async fn door() -> Door {
    let server = TestServer::start(&[]).await;
    let agent = server.agent("agent").await;
    let http = Http::new(&server.url(), Some(&agent.token));
    Door { server, agent, http }
}

impl Door {
    /// Declares a known-good state with both documents, so refusals can be shown to change nothing.
    async fn seed(&self) -> Value {
        let answer = self
            .http
            .declare(&json!({
                "configuration": {"default_model": "scripted/default", "approval_mode": "ask"},
                "prompt_documents": {"system_prompt": {"content": "You are {{agent}}."}, "summarizer": {"content": "Keep decisions."}}
            }))
            .await;
        assert_eq!(answer.status, 200, "{:?}", answer.body);
        answer.body
    }

    /// The stored profile row and the GET body, to compare before and after a refusal.
    async fn snapshot(&self) -> (Value, Value) {
        let row = self.server.store().profile(self.agent.id).await.expect("store").expect("profile");
        let stored = json!({
            "configuration": row.configuration, "system_prompt": row.system_prompt, "summarizer": row.summarizer,
            "system_prompt_version": row.system_prompt_version, "summarizer_version": row.summarizer_version,
        });
        let mut read = self.http.profile().await.body;
        read["measured_at"] = Value::Null;
        (stored, read)
    }

    /// Asserts that `body` is refused with `status` and `code` and that nothing changed.
    async fn refused(&self, body: &Value, status: u16, code: &str) -> Answer {
        let before = self.snapshot().await;
        let answer = self.http.declare(body).await;
        assert_eq!((answer.status, answer.code()), (status, Some(code)), "{body} -> {:?}", answer.body);
        assert_eq!(self.snapshot().await, before, "a refused PUT changed the profile: {body}");
        answer
    }
}

fn field_named(answer: &Answer, field: &str) {
    assert!(answer.message().contains(field), "the message should name {field}: {}", answer.message());
}

#[tokio::test]
async fn r01_configuration_root_is_required() {
    let d = door().await;
    d.seed().await;
    for body in [
        json!({}),
        json!({"configuration": null}),
        json!({"configuration": []}),
        json!({"configuration": "x"}),
        json!([1]),
    ] {
        d.refused(&body, 400, "parameter_missing").await;
    }
}

#[tokio::test]
async fn r02_prompt_documents_shapes() {
    let d = door().await;
    d.seed().await;
    for docs in [json!([]), json!("x"), json!({"system_prompt": "text"}), json!({"summarizer": 3})] {
        d.refused(&json!({"configuration": {}, "prompt_documents": docs}), 400, "parameter_missing").await;
    }
}

#[tokio::test]
async fn r03_omitted_null_or_empty_documents_clear_slots() {
    let d = door().await;
    for (docs, system_cleared, summarizer_cleared) in [
        (None, true, true),
        (Some(json!(null)), true, true),
        (Some(json!({})), true, true),
        (Some(json!({"summarizer": {"content": "kept"}})), true, false),
        (Some(json!({"system_prompt": {"content": "kept"}, "summarizer": null})), false, true),
    ] {
        d.seed().await;
        let mut body = json!({"configuration": {}});
        if let Some(docs) = docs.clone() {
            body["prompt_documents"] = docs;
        }
        let answer = d.http.declare(&body).await;
        assert_eq!(answer.status, 200, "{body}");
        let row = d.server.store().profile(d.agent.id).await.expect("store").expect("profile");
        assert_eq!(row.system_prompt.is_none(), system_cleared, "{docs:?}");
        assert_eq!(row.summarizer.is_none(), summarizer_cleared, "{docs:?}");
    }
}

#[tokio::test]
async fn r04_slot_content_and_roles() {
    let d = door().await;
    d.seed().await;
    d.refused(&json!({"configuration": {}, "prompt_documents": {"system_prompt": {}}}), 422, "prompt_document_invalid")
        .await;
    d.refused(
        &json!({"configuration": {}, "prompt_documents": {"summarizer": {"content": "x", "role": "developer"}}}),
        422,
        "prompt_document_invalid",
    )
    .await;
    let answer = d
        .http
        .declare(&json!({"configuration": {}, "prompt_documents": {"system_prompt": {"content": ""}, "summarizer": {"content": "s"}}}))
        .await;
    assert_eq!(answer.status, 200);
    let row = d.server.store().profile(d.agent.id).await.expect("store").expect("profile");
    assert_eq!(
        row.system_prompt,
        Some(json!({"content": "", "role": "system"})),
        "empty content stores an empty document"
    );
    assert_eq!(row.summarizer, Some(json!({"content": "s", "role": "system"})));
    let developer = d
        .http
        .declare(
            &json!({"configuration": {}, "prompt_documents": {"system_prompt": {"content": "x", "role": "developer"}}}),
        )
        .await;
    assert_eq!(developer.status, 200);
}

#[tokio::test]
async fn r05_whole_replacement_reads_back_cleared_fields() {
    let d = door().await;
    d.seed().await;
    let answer = d.http.declare(&json!({"configuration": {}})).await;
    assert_eq!(answer.status, 200);
    let configuration = &d.http.profile().await.body["configuration"];
    assert_eq!(configuration["tool_definitions"], json!([]));
    assert_eq!(configuration["kernel_tools"], json!([]));
    assert_eq!(configuration["runner_executor_public_ids"], json!([]));
    assert_eq!(configuration["runner_tool_names"], Value::Null);
    assert_eq!(configuration["default_model"], Value::Null);
    assert_eq!(configuration["approval_mode"], Value::Null);
    assert_eq!(configuration["fallback_models"], Value::Null);
}

#[tokio::test]
async fn r06_refusals_change_nothing_and_success_bumps_versions() {
    let d = door().await;
    d.seed().await;
    let (before, _) = d.snapshot().await;
    d.refused(&json!({"configuration": {"approval_mode": "sometimes"}}), 422, "validation_failed").await;
    d.refused(
        &json!({"configuration": {}, "prompt_documents": {"system_prompt": {"content": "x".repeat(65_537)}}}),
        422,
        "prompt_document_too_large",
    )
    .await;
    // Identical content still advances both versions.
    let again = d.seed().await;
    assert_eq!(
        again["prompt_documents"]["system_prompt"]["version"],
        json!(before["system_prompt_version"].as_i64().unwrap_or(0) + 1)
    );
    assert_eq!(
        again["prompt_documents"]["summarizer"]["version"],
        json!(before["summarizer_version"].as_i64().unwrap_or(0) + 1)
    );
}

#[tokio::test]
async fn r08_unknown_fields_are_ignored() {
    let d = door().await;
    let answer = d
        .http
        .declare(&json!({"configuration": {"validation_context": {"admin": true}, "surprise": 1}, "extra_root": true, "prompt_documents": {"persona": {"content": "x"}}}))
        .await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    let configuration = &d.http.profile().await.body["configuration"];
    assert_eq!(configuration.get("validation_context"), None, "validation_context cannot be injected");
    assert_eq!(configuration.get("surprise"), None);
}

#[tokio::test]
async fn r09_credentials_planes_and_rate_limit() {
    let server = TestServer::start_with(&[], |config| {
        config.doors.requests_per_minute = 1;
        config.doors.burst = 3;
    })
    .await;
    let agent = server.agent("agent").await;
    let human = server.human("person").await;
    let runner = server.runner("runner").await;
    let body = json!({"configuration": {}});
    let anonymous = Http::new(&server.url(), None).declare(&body).await;
    assert_eq!((anonymous.status, anonymous.code()), (401, Some("unauthorized")));
    let transport = Http::new(&server.url(), Some(&runner.token)).declare(&body).await;
    assert_eq!((transport.status, transport.code()), (401, Some("unauthorized")));
    let garbage = Http::new(&server.url(), Some("sk-nexus-api-v1-0000")).declare(&body).await;
    assert_eq!((garbage.status, garbage.code()), (401, Some("unauthorized")));
    let person = Http::new(&server.url(), Some(&human.token)).declare(&body).await;
    assert_eq!((person.status, person.code()), (403, Some("not_agent")));
    // The budget: a burst of 3, then 429 with Retry-After in whole seconds.
    let http = Http::new(&server.url(), Some(&agent.token));
    for _ in 0..3 {
        assert_eq!(http.profile().await.status, 200);
    }
    let limited = http.declare(&body).await;
    assert_eq!((limited.status, limited.code()), (429, Some("rate_limited")));
    let seconds: u64 =
        limited.retry_after.as_deref().and_then(|s| s.parse().ok()).expect("Retry-After in whole seconds");
    assert!((1..=60).contains(&seconds), "{seconds}");
}

#[tokio::test]
async fn r10_the_answer_is_the_profile_and_get_output_round_trips() {
    let d = door().await;
    let put = d.seed().await;
    let mut get = d.http.profile().await.body;
    let mut put_body = put.clone();
    put_body["measured_at"] = Value::Null;
    get["measured_at"] = Value::Null;
    assert_eq!(put_body, get, "PUT answers exactly what GET reads");
    // The GET output is itself an accepted PUT body, and converges to the same contents.
    let before = d.server.store().profile(d.agent.id).await.expect("store").expect("profile");
    let again = d.http.declare(&get).await;
    assert_eq!(again.status, 200, "{:?}", again.body);
    let after = d.server.store().profile(d.agent.id).await.expect("store").expect("profile");
    assert_eq!(after.configuration, before.configuration);
    assert_eq!(after.system_prompt, before.system_prompt);
    assert_eq!(after.summarizer, before.summarizer);
    assert_eq!(after.system_prompt_version, before.system_prompt_version + 1);
}

#[tokio::test]
async fn r11_default_model_resolver_words() {
    let d = door().await;
    d.seed().await;
    for (model, word) in [
        ("nowhere/x", "unknown_provider"),
        ("bare-word", "unknown_model"),
        ("model_selector:fast", "unknown_model"),
        ("scripted/absent", "unknown_model"),
        ("openrouter/z-ai/glm-5.3", "missing_credential"),
    ] {
        let answer = d.refused(&json!({"configuration": {"default_model": model}}), 422, "validation_failed").await;
        field_named(&answer, "default_model");
        field_named(&answer, word);
    }
}

#[tokio::test]
async fn r12_approval_mode_vocabulary_and_requirement() {
    let d = door().await;
    d.seed().await;
    let runner = d.server.runner("runner").await;
    for configuration in [
        json!({"approval_mode": "sometimes"}),
        json!({"approval_mode": 1}),
        json!({"kernel_tools": ["nexus.memory.read"]}),
        json!({"runner_executor_public_ids": [runner.id]}),
        json!({"tool_definitions": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]}),
        json!({"lifecycle_hooks": {"stop": {"tool": "review", "timeout_ms": 1000, "max_continuations": 1}}}),
    ] {
        let answer = d.refused(&json!({"configuration": configuration}), 422, "validation_failed").await;
        field_named(&answer, "approval_mode");
    }
    for mode in ["bypass", "ask", "rules"] {
        let answer = d
            .http
            .declare(&json!({"configuration": {"approval_mode": mode, "runner_executor_public_ids": [runner.id]}}))
            .await;
        assert_eq!(answer.status, 200, "{mode}");
    }
    // Candidates whose runner_tool_names is [] import nothing and need no mode.
    let answer = d
        .http
        .declare(&json!({"configuration": {"runner_executor_public_ids": [runner.id], "runner_tool_names": []}}))
        .await;
    assert_eq!(answer.status, 200);
}

#[tokio::test]
async fn named_definitions_mint_replace_delete_restore() {
    let d = door().await;
    let body = json!({"scope": "instance", "description": "Reviews changes.", "configuration": {"default_model": "scripted/default"}});
    let minted = d.http.put("/agent_api/v1/profile/agents/reviewer", &body).await;
    assert_eq!(minted.status, 201, "{:?}", minted.body);
    assert_eq!(minted.body["identifier"], "agent/reviewer");
    let replaced = d.http.put("/agent_api/v1/profile/agents/reviewer", &body).await;
    assert_eq!(replaced.status, 200);
    let list = d.http.get("/agent_api/v1/profile/agents").await;
    assert_eq!(list.body["agents"].as_array().map(Vec::len), Some(1));
    assert_eq!(d.http.delete("/agent_api/v1/profile/agents/reviewer").await.status, 204);
    assert_eq!(d.http.get("/agent_api/v1/profile/agents").await.body["agents"], json!([]));
    assert_eq!(d.http.delete("/agent_api/v1/profile/agents/reviewer").await.status, 404);
    let restored = d.http.put("/agent_api/v1/profile/agents/reviewer", &body).await;
    assert_eq!(restored.status, 200, "a deleted definition is restored, not minted");
    // The handle grammar: anything else is a route miss.
    assert_eq!(d.http.put("/agent_api/v1/profile/agents/Bad_Name", &body).await.status, 404);
    assert_eq!(d.http.put("/agent_api/v1/profile/agents/x", &body).await.status, 404);
    for (bad, status, code) in [
        (json!({"description": "d", "configuration": {}}), 400, "parameter_missing"),
        (json!({"scope": "everyone", "description": "d", "configuration": {}}), 422, "validation_failed"),
        (json!({"scope": "steward", "description": "two\nlines", "configuration": {}}), 422, "validation_failed"),
        (
            json!({"scope": "steward", "description": "d", "configuration": {"approval_mode": "maybe"}}),
            422,
            "validation_failed",
        ),
    ] {
        let answer = d.http.put("/agent_api/v1/profile/agents/other", &bad).await;
        assert_eq!((answer.status, answer.code()), (status, Some(code)), "{bad}");
    }
}

#[tokio::test]
async fn assembly_preview_writes_nothing() {
    let d = door().await;
    let runner = d.server.runner("runner").await;
    let (raw, _) = nexus_tests::RawRunner::connect(&d.server.url(), runner.id, &runner.token).await;
    let effect = json!({"kind": "read_only", "destructive": false, "effect_scope": "closed", "idempotency": "intrinsic", "reconciliation": "none"});
    raw.announce(&json!({"tools": [
        {"name": "grep", "description": "Search.", "input_schema": {"type": "object"}, "effect_profile": effect},
        {"name": "logs", "effect_profile": effect}
    ], "environment": {"os": "linux"}}))
        .await;
    let other = d.server.runner("other").await;
    let before = d.server.store().fingerprint().await.expect("fingerprint");
    let body = json!({"default_runner_executor_public_id": runner.id, "configuration": {"runner_executor_public_ids": [runner.id]}});
    let answer = d.http.post("/agent_api/v1/tools/assembly", &body).await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    let tools = answer.body["tool_definitions"].as_array().expect("tools");
    assert_eq!(tools.len(), 1, "operator-only announcements are not imported");
    assert_eq!(tools[0]["function"]["name"], "grep");
    assert_eq!(tools[0]["defer_loading"], true);
    assert_eq!(answer.body["environment"]["default_runner_executor_public_id"], json!(runner.id));
    assert_eq!(answer.body["environment"]["runner_candidates"][0]["environment"]["os"], "linux");
    let missing = d.http.post("/agent_api/v1/tools/assembly", &json!({"configuration": {}})).await;
    assert_eq!((missing.status, missing.code()), (400, Some("parameter_missing")));
    let undeclared = d
        .http
        .post("/agent_api/v1/tools/assembly", &json!({"default_runner_executor_public_id": other.id, "configuration": {"runner_executor_public_ids": [runner.id]}}))
        .await;
    assert_eq!((undeclared.status, undeclared.code()), (422, Some("runner_not_declared")));
    let big = json!({"default_runner_executor_public_id": null, "configuration": {"tool_definitions": [{"type": "function", "function": {"name": "f", "description": "x".repeat(1_100_000)}}]}});
    let too_large = d.http.post("/agent_api/v1/tools/assembly", &big).await;
    assert_eq!((too_large.status, too_large.code()), (413, Some("content_too_large")));
    assert_eq!(d.server.store().fingerprint().await.expect("fingerprint"), before, "the preview wrote to the store");
    // The fingerprint does see writes.
    assert_eq!(d.http.declare(&json!({"configuration": {}})).await.status, 200);
    assert_ne!(d.server.store().fingerprint().await.expect("fingerprint"), before);
}
