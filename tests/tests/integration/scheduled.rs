//! Scheduled inputs (`docs/executions.md`, "Scheduled inputs"; REFERENCE 9): an input admitted
//! with `deliver_at` / `deliver_in` is durable at once, its execution `pending`, but it is held
//! out of its conversation's line until its time on the server's clock; then it joins the line
//! as an ordinary turn. It survives restarts, a time that passed while nexus was down delivers it
//! at boot, the cancel door cancels it, and the four refusal words change nothing.
//!
//! A real server and a local fake provider whose request count proves when the model was asked;
//! every wait for a delivery moves the test clock.

use std::time::Duration;

use serde_json::{Value, json};

use nexus_actors::store::ExecutionRow;
use nexus_proto::agent::v1::CreateInputRequest;
use nexus_proto::{ConversationId, ErrorCode, ExecutionId, InputId, Refusal, RunStatus};
use nexus_tests::{Act, FakeProvider, Http, Minted, TestServer, agent_client, authed, wait_until};

const WAIT: Duration = Duration::from_secs(30);
const MINUTE_MS: i64 = 60_000;

struct Fixture {
    server: TestServer,
    agent: Minted,
}

impl Fixture {
    /// A server whose `fake` provider is `fake`, and an Agent declared on `fake/chat`.
    async fn start(fake: &FakeProvider) -> Fixture {
        let base_url = fake.openai_base_url();
        let server = TestServer::start_with(&[], move |config| {
            config.providers.providers.insert(
                "fake".into(),
                nexus_actors::model::ProviderConfig {
                    base_url: Some(base_url),
                    allow_any_model: true,
                    ..nexus_actors::model::ProviderConfig::new(nexus_actors::model::ProviderKind::OpenAiCompatible)
                },
            );
        })
        .await;
        let agent = server.agent("agent").await;
        let f = Fixture { server, agent };
        let configuration = json!({"approval_mode": "bypass", "default_model": "fake/chat"});
        let declared = f.http().declare(&json!({"configuration": configuration})).await;
        assert_eq!(declared.status, 200, "declared: {:?}", declared.body);
        f
    }

    fn http(&self) -> Http {
        Http::new(&self.server.url(), Some(&self.agent.token))
    }

    /// Posts `body` (with `text`) as an input and answers the admission's body.
    async fn post(&self, text: &str, extra: Value) -> Value {
        let mut body = json!({"text": text});
        for (key, value) in extra.as_object().expect("object") {
            body[key] = value.clone();
        }
        let answer = self.http().post("/agent_api/v1/inputs", &body).await;
        assert_eq!(answer.status, 201, "admitted: {:?}", answer.body);
        answer.body
    }

    async fn status_is(&self, run: ExecutionId, status: RunStatus) -> ExecutionRow {
        wait_until(&format!("{run} to be {status}"), WAIT, || async {
            self.server.store().execution(run).await.ok().flatten().filter(|row| row.status == status)
        })
        .await
    }
}

fn execution(body: &Value) -> ExecutionId {
    body["execution_public_id"].as_str().expect("id").parse().expect("uuid")
}

fn input(body: &Value) -> InputId {
    body["input_public_id"].as_str().expect("id").parse().expect("uuid")
}

fn conversation(body: &Value) -> ConversationId {
    body["conversation_public_id"].as_str().expect("id").parse().expect("uuid")
}

/// An RFC 3339 UTC rendering of Unix milliseconds `at`, with a `+hh:mm` offset of `offset_min`.
fn iso(at: i64, offset_min: i64) -> String {
    let local = at + offset_min * MINUTE_MS;
    let days = local.div_euclid(86_400_000);
    let ms = local.rem_euclid(86_400_000);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let sign = if offset_min < 0 { '-' } else { '+' };
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}{sign}{:02}:{:02}",
        ms / 3_600_000,
        ms / 60_000 % 60,
        ms / 1_000 % 60,
        ms % 1_000,
        offset_min.abs() / 60,
        offset_min.abs() % 60
    )
}

#[tokio::test]
async fn every_refusal_word_is_refused_and_writes_nothing() {
    let fake = FakeProvider::start().await;
    let f = Fixture::start(&fake).await;
    fake.script("chat", [Act::Text("first".into())]);
    let first = f.post("first", json!({})).await;
    f.status_is(execution(&first), RunStatus::Completed).await;
    let conversation = first["conversation_public_id"].clone();
    let before = f.server.store().fingerprint().await.expect("fingerprint");
    let now = f.server.clock().now_ms();
    let cases = [
        (json!({"deliver_at": iso(now + 10 * MINUTE_MS, 0), "deliver_in": "20m"}), 422, "deliver_at_ambiguous"),
        (json!({"deliver_in": "20m", "delivery_mode": "steer"}), 422, "deliver_at_not_steerable"),
        (
            json!({"deliver_at": iso(now + 10 * MINUTE_MS, 60), "delivery_mode": "steer"}),
            422,
            "deliver_at_not_steerable",
        ),
        (json!({"deliver_at": iso(now - 3 * MINUTE_MS, 0)}), 422, "deliver_at_in_past"),
        (json!({"deliver_at": iso(now - 3 * MINUTE_MS, -300)}), 422, "deliver_at_in_past"),
        (json!({"deliver_in": "3654d"}), 422, "deliver_at_too_far"),
        (json!({"deliver_at": iso(now + 3_654 * 1_440 * MINUTE_MS, 0)}), 422, "deliver_at_too_far"),
        (json!({"deliver_at": "2031-01-01T09:00:00"}), 422, "validation_failed"),
        (json!({"deliver_in": "0m"}), 422, "validation_failed"),
        (json!({"deliver_in": "1w"}), 422, "validation_failed"),
        (json!({"deliver_in": 90}), 400, "parameter_invalid"),
    ];
    for (extra, status, code) in cases {
        for continued in [false, true] {
            let mut body = json!({"text": "later"});
            if continued {
                body["conversation_public_id"] = conversation.clone();
            }
            for (key, value) in extra.as_object().expect("object") {
                body[key] = value.clone();
            }
            let answer = f.http().post("/agent_api/v1/inputs", &body).await;
            assert_eq!((answer.status, answer.code()), (status, Some(code)), "{body}: {answer:?}");
        }
    }
    let no_offset =
        f.http().post("/agent_api/v1/inputs", &json!({"text": "x", "deliver_at": "2031-01-01T09:00:00"})).await;
    assert!(no_offset.message().contains("offset"), "the message says what is missing: {}", no_offset.message());
    // The gRPC twin refuses by the same words.
    let mut client = agent_client(&f.server).await;
    let request = CreateInputRequest {
        text: "later".into(),
        deliver_at: iso(now + MINUTE_MS, 0),
        deliver_in: "1m".into(),
        ..CreateInputRequest::default()
    };
    let status = client.create_input(authed(request, &f.agent)).await.expect_err("refused");
    assert_eq!(Refusal::from_status(&status).code, ErrorCode::DeliverAtAmbiguous);
    assert_eq!(f.server.store().fingerprint().await.expect("fingerprint"), before, "refusals write nothing");
    assert_eq!(fake.count("chat"), 1);

    // A time up to two minutes past is taken, and delivered at once.
    fake.script("chat", [Act::Text("skewed".into())]);
    let skewed = f.post("skewed", json!({"deliver_at": iso(now - 90_000, 120)})).await;
    assert_eq!(skewed["deliver_at"].as_i64(), Some(now - 90_000));
    let row = f.status_is(execution(&skewed), RunStatus::Completed).await;
    assert_eq!(row.final_text.as_deref(), Some("skewed"));
}

#[tokio::test]
async fn a_scheduled_input_waits_out_of_the_line_until_the_clock_reaches_it() {
    let fake = FakeProvider::start().await;
    let f = Fixture::start(&fake).await;
    let before = f.server.clock().now_ms();
    let scheduled = f.post("remind me", json!({"deliver_in": "20m"})).await;
    let after = f.server.clock().now_ms();
    let run = execution(&scheduled);
    let deliver_at = scheduled["deliver_at"].as_i64().expect("deliver_at");
    assert!((before + 20 * MINUTE_MS..=after + 20 * MINUTE_MS).contains(&deliver_at), "{scheduled}");
    assert_eq!((scheduled["status"].as_str(), &scheduled["queue"]), (Some("pending"), &Value::Null));
    assert_eq!(scheduled["turn"].as_i64(), Some(1));
    // Durable at once, its execution pending, and the conversation idle: its line is empty.
    let view = f.http().get(&format!("/agent_api/v1/executions/{run}")).await;
    assert_eq!(view.status, 200);
    assert_eq!((view.body["status"].as_str(), view.body["deliver_at"].as_i64()), (Some("pending"), Some(deliver_at)));
    assert_eq!(view.body["queue"], Value::Null, "it waits for its time, not behind a turn");
    assert!(f.server.store().conversation_line(conversation(&scheduled)).await.expect("line").is_empty());

    // An ordinary input posted after it is not held behind it: it runs first.
    fake.script(
        "chat",
        [
            Act::Text("ordinary answered".into()),
            Act::Text("probe answered".into()),
            Act::Text("reminder answered".into()),
        ],
    );
    let ordinary = f.post("ordinary", json!({"conversation_public_id": scheduled["conversation_public_id"]})).await;
    assert_eq!((ordinary["queue"].clone(), ordinary["deliver_at"].clone()), (Value::Null, Value::Null));
    f.status_is(execution(&ordinary), RunStatus::Completed).await;
    assert_eq!(fake.count("chat"), 1, "only the ordinary turn asked the model");
    let row = f.server.store().execution(run).await.expect("store").expect("row");
    assert_eq!((row.status, row.event_seq), (RunStatus::Pending, 0), "never materialized");

    // Not a minute early: a turn posted after the clock moved 19 minutes runs, and it is still
    // held (a delivery made due would have been written within that turn's model call).
    f.server.clock().advance(Duration::from_secs(19 * 60));
    let probe = f.post("probe", json!({"conversation_public_id": scheduled["conversation_public_id"]})).await;
    f.status_is(execution(&probe), RunStatus::Completed).await;
    assert_eq!(fake.count("chat"), 2);
    let held = f.server.store().held_inputs().await.expect("held");
    assert_eq!(held, vec![(input(&scheduled), deliver_at)], "still held at 19 minutes");
    // ...and at its time it joins the line as the conversation's next turn, after the ordinary one.
    f.server.clock().advance(Duration::from_secs(61));
    let done = f.status_is(run, RunStatus::Completed).await;
    assert_eq!(done.final_text.as_deref(), Some("reminder answered"));
    assert_eq!(fake.count("chat"), 3);
    let delivered = f.server.store().input(input(&scheduled)).await.expect("store").expect("input");
    assert_eq!((delivered.turn, delivered.deliver_at), (4, Some(deliver_at)), "the turn after the others");
    let asked = &fake.requests_for("chat")[2];
    let history = asked.body["messages"].to_string();
    assert!(history.contains("ordinary") && history.contains("remind me"), "{history}");
}

#[tokio::test]
async fn a_restart_before_its_time_still_delivers_it_once_after() {
    let fake = FakeProvider::start().await;
    let f = Fixture::start(&fake).await;
    let scheduled = f.post("after the restart", json!({"deliver_in": "2h"})).await;
    let run = execution(&scheduled);
    let Fixture { server, agent } = f;
    let server = server.restart(&[]).await;
    let f = Fixture { server, agent };
    let row = f.server.store().execution(run).await.expect("store").expect("row");
    assert_eq!(row.status, RunStatus::Pending, "held across the restart");
    let held = f.server.store().held_inputs().await.expect("held");
    assert_eq!(held, vec![(input(&scheduled), scheduled["deliver_at"].as_i64().expect("at"))]);
    fake.script("chat", [Act::Text("delivered".into())]);
    f.server.clock().advance(Duration::from_secs(2 * 3_600 + 1));
    let done = f.status_is(run, RunStatus::Completed).await;
    assert_eq!(done.final_text.as_deref(), Some("delivered"));
    // Once: another restart and more time deliver nothing again.
    let Fixture { server, agent } = f;
    let server = server.restart_down_for(&[], Duration::from_secs(3 * 3_600)).await;
    let f = Fixture { server, agent };
    assert!(f.server.store().held_inputs().await.expect("held").is_empty());
    fake.script("chat", [Act::Text("next".into())]);
    let next = f.post("next", json!({"conversation_public_id": scheduled["conversation_public_id"]})).await;
    f.status_is(execution(&next), RunStatus::Completed).await;
    assert_eq!(fake.count("chat"), 2, "the scheduled turn asked once, the next once");
}

#[tokio::test]
async fn a_time_that_passed_while_nexus_was_down_is_delivered_at_boot() {
    let fake = FakeProvider::start().await;
    let f = Fixture::start(&fake).await;
    let at = f.server.clock().now_ms() + 30 * MINUTE_MS;
    let scheduled = f.post("while you were out", json!({"deliver_at": iso(at, -420)})).await;
    assert_eq!(scheduled["deliver_at"].as_i64(), Some(at), "the offset is honoured");
    let run = execution(&scheduled);
    fake.script("chat", [Act::Text("caught up".into())]);
    let Fixture { server, agent } = f;
    let server = server.restart_down_for(&[], Duration::from_secs(31 * 60)).await;
    let f = Fixture { server, agent };
    let done = f.status_is(run, RunStatus::Completed).await;
    assert_eq!(done.final_text.as_deref(), Some("caught up"));
    assert_eq!(fake.count("chat"), 1);
}

#[tokio::test]
async fn the_cancel_door_cancels_a_scheduled_input_and_the_bound_counts_it() {
    let fake = FakeProvider::start().await;
    let f = Fixture::start(&fake).await;
    let scheduled = f.post("never mind", json!({"deliver_in": "20m"})).await;
    let run = execution(&scheduled);
    let id = input(&scheduled);
    let canceled = f.http().post(&format!("/agent_api/v1/inputs/{id}/cancel"), &json!({})).await;
    assert_eq!((canceled.status, canceled.body["status"].as_str()), (200, Some("canceled")), "{canceled:?}");
    let again = f.http().post(&format!("/agent_api/v1/inputs/{id}/cancel"), &json!({})).await;
    assert_eq!((again.status, again.body["status"].as_str()), (200, Some("canceled")), "{again:?}");
    assert!(f.server.store().held_inputs().await.expect("held").is_empty(), "a canceled input is not held");
    f.server.clock().advance(Duration::from_secs(21 * 60));
    // Its time passes and nothing runs: the next input is the only one to ask the model.
    fake.script("chat", [Act::Text("next".into())]);
    let conversation_id = scheduled["conversation_public_id"].clone();
    let next = f.post("next", json!({"conversation_public_id": conversation_id})).await;
    f.status_is(execution(&next), RunStatus::Completed).await;
    assert_eq!(fake.count("chat"), 1);
    assert_eq!(f.server.store().execution(run).await.expect("store").expect("row").status, RunStatus::Canceled);

    // Held inputs count toward the conversation's 16 waiting inputs.
    for n in 0..16 {
        f.post(&format!("held {n}"), json!({"conversation_public_id": conversation_id, "deliver_in": "1d"})).await;
    }
    let before = f.server.store().fingerprint().await.expect("fingerprint");
    let full = f
        .http()
        .post(
            "/agent_api/v1/inputs",
            &json!({"text": "one too many", "conversation_public_id": conversation_id, "deliver_in": "1d"}),
        )
        .await;
    assert_eq!((full.status, full.code()), (409, Some("input_queue_full")), "{full:?}");
    assert_eq!(f.server.store().fingerprint().await.expect("fingerprint"), before, "refused, nothing written");
    // An input that starts at once waits for nothing, so it is taken.
    fake.script("chat", [Act::Text("now".into())]);
    let now = f.post("now", json!({"conversation_public_id": conversation_id})).await;
    f.status_is(execution(&now), RunStatus::Completed).await;
    // Over gRPC, a scheduled admission reports its time.
    let mut client = agent_client(&f.server).await;
    let request =
        CreateInputRequest { text: "elsewhere".into(), deliver_in: "90s".into(), ..CreateInputRequest::default() };
    let reply = client.create_input(authed(request, &f.agent)).await.expect("admitted").into_inner();
    assert!(reply.deliver_at_ms > f.server.clock().now_ms(), "{reply:?}");
    assert_eq!((reply.status.as_str(), reply.queue_position), ("pending", 0));
}
