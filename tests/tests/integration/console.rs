//! The web console (`docs/console.md`) in headless Chromium, driven over WebDriver by Debian's
//! `chromium-driver`: a person signs in, opens a running execution, watches its timeline fill,
//! approves its parked calls and sees it complete. A screenshot of the execution page is kept at
//! `target/console-execution.png`.
//!
//! Without `chromedriver` on the PATH the test says so and passes, unless
//! `NEXUS_TEST_BROWSER=required` (as `.ci/run` sets, after installing it), when it fails.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};

use nexus_actors::doors::api::CreateInput;
use nexus_proto::{RunStatus, TaskStatus};
use nexus_tests::probe::Probe;
use nexus_tests::processes::free_loopback_addr;
use nexus_tests::{TestServer, key};

const WAIT: Duration = Duration::from_secs(30);

/// A Chromium session, and the chromedriver that drives it. Dropped, both are killed: the driver
/// leads a process group of its own, and the Chromium it started is in it.
struct Browser {
    driver: tokio::process::Child,
    http: reqwest::Client,
    session: String,
    _profile: tempfile::TempDir,
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?.to_str()?.split(':').map(|dir| PathBuf::from(dir).join(name)).find(|path| path.is_file())
}

impl Browser {
    async fn start() -> Option<Browser> {
        let required = std::env::var("NEXUS_TEST_BROWSER").is_ok_and(|v| v == "required");
        let (Some(driver), Some(chromium)) = (find_on_path("chromedriver"), find_on_path("chromium")) else {
            assert!(
                !required,
                "NEXUS_TEST_BROWSER=required, but chromedriver or chromium is not on the PATH (apt-get install chromium chromium-driver)"
            );
            eprintln!("skipped: no chromedriver or chromium on the PATH (apt-get install chromium chromium-driver)");
            return None;
        };
        let port = free_loopback_addr().port();
        let driver = tokio::process::Command::new(driver)
            .arg(format!("--port={port}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .expect("chromedriver runs");
        let http = reqwest::Client::new();
        let base = format!("http://127.0.0.1:{port}");
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let ready = http.get(format!("{base}/status")).send().await.ok();
            let ready = match ready {
                Some(answer) => answer.json::<Value>().await.ok().is_some_and(|v| v["value"]["ready"] == true),
                None => false,
            };
            if ready {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "chromedriver did not start");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let profile = tempfile::tempdir().expect("profile");
        let capabilities = json!({"capabilities": {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": {
            "binary": chromium,
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1400,1100", format!("--user-data-dir={}", profile.path().display())],
        }}}});
        let created: Value = http
            .post(format!("{base}/session"))
            .json(&capabilities)
            .send()
            .await
            .expect("a session")
            .json()
            .await
            .expect("JSON");
        let session = created["value"]["sessionId"].as_str().unwrap_or_else(|| panic!("no session: {created}"));
        Some(Browser { driver, http, session: format!("{base}/session/{session}"), _profile: profile })
    }

    /// Ends the session: Chromium quits.
    async fn quit(&self) {
        self.command(reqwest::Method::DELETE, "", None).await;
    }

    async fn command(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut request = self.http.request(method, format!("{}{path}", self.session));
        if let Some(body) = body {
            request = request.json(&body);
        }
        let answer: Value = request.send().await.expect("the driver answers").json().await.expect("JSON");
        if answer["value"]["error"].is_string() {
            panic!("WebDriver {path}: {}", answer["value"]);
        }
        answer["value"].clone()
    }

    async fn goto(&self, url: &str) {
        self.command(reqwest::Method::POST, "/url", Some(json!({"url": url}))).await;
    }

    async fn script(&self, script: &str) -> Value {
        self.command(reqwest::Method::POST, "/execute/sync", Some(json!({"script": script, "args": []}))).await
    }

    /// Polls `condition` (a script's `return` value) until it is truthy; its value.
    async fn wait_for(&self, what: &str, condition: &str) -> Value {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let value = self.script(condition).await;
            if !(value.is_null() || value == false || value == 0 || value == "") {
                return value;
            }
            if tokio::time::Instant::now() > deadline {
                let page = self.script("return document.body.innerText").await;
                panic!("no {what} in the page:\n{}", page.as_str().unwrap_or_default());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn element(&self, css: &str) -> String {
        let found =
            self.command(reqwest::Method::POST, "/element", Some(json!({"using": "css selector", "value": css}))).await;
        found.as_object().and_then(|o| o.values().next()).and_then(Value::as_str).expect("an element id").to_owned()
    }

    async fn click(&self, css: &str) {
        let element = self.element(css).await;
        self.command(reqwest::Method::POST, &format!("/element/{element}/click"), Some(json!({}))).await;
    }

    async fn clear(&self, css: &str) {
        let element = self.element(css).await;
        self.command(reqwest::Method::POST, &format!("/element/{element}/clear"), Some(json!({}))).await;
    }

    async fn type_into(&self, css: &str, text: &str) {
        let element = self.element(css).await;
        self.command(reqwest::Method::POST, &format!("/element/{element}/value"), Some(json!({"text": text}))).await;
    }

    async fn screenshot(&self) -> Vec<u8> {
        use base64::Engine;
        let encoded = self.command(reqwest::Method::GET, "/screenshot", None).await;
        base64::engine::general_purpose::STANDARD.decode(encoded.as_str().expect("base64")).expect("a PNG")
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if let Some(pid) = self.driver.id().and_then(|pid| i32::try_from(pid).ok()) {
            let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
    }
}

/// The workspace's `target/` dir, from this test binary's place in it.
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test exe");
    exe.ancestors().nth(3).expect("target dir").to_path_buf()
}

#[tokio::test]
async fn a_person_signs_in_watches_the_timeline_approves_and_sees_the_execution_complete() {
    let Some(browser) = Browser::start().await else { return };
    let script = json!({"rounds": [
        {"tool_calls": [{"id": "c1", "name": "probe", "arguments": {"depth": 1}},
                        {"id": "c2", "name": "probe", "arguments": {"depth": 2}}]},
        {"final": "probe said {{tool:c1}} and {{tool:c2}}"}
    ]});
    let server = TestServer::start(&[("probe", script)]).await;
    let Probe { agent, runner, raw } = Probe::start(&server, "ask", "scripted/probe").await;
    let worker = Probe::serve(raw, |task_key| format!("depth seen on {task_key}"));
    let caller = server.caller(&agent).await;
    let input = CreateInput { text: "probe twice".to_owned(), ..CreateInput::default() };
    let run = server.server.api.create_input(&caller, input).await.expect("admitted").execution_public_id;

    // Sign in, from a link to the executions: a wrong token is refused with its word, the right
    // one goes into the tab's session storage (nowhere else) and on to the page the link named.
    browser.goto(&format!("{}/console#/executions", server.url())).await;
    browser.wait_for("the sign-in form", "return document.querySelector('#token') !== null").await;
    browser.type_into("#token", "not-a-token").await;
    browser.click("#sign-in").await;
    let refused = browser.wait_for("the refusal", "return document.querySelector('#signin-error')?.textContent").await;
    assert!(refused.as_str().expect("text").starts_with("unauthorized"), "{refused}");
    browser.clear("#token").await;
    browser.type_into("#token", &agent.token).await;
    browser.click("#sign-in").await;
    let row = format!("#executions tr[data-execution='{run}'] a");
    browser.wait_for("the execution in the list", &format!("return document.querySelector(\"{row}\") !== null")).await;
    let stored = browser.script("return [sessionStorage.getItem('nexus.token'), document.cookie, location.href]").await;
    assert_eq!(stored[0], agent.token.as_str());
    assert_eq!(stored[1], "", "no cookie");
    assert!(!stored[2].as_str().expect("url").contains(&agent.token), "the token is not in the URL");

    // The execution page: both calls wait for approval, each a bar on the runner's lane.
    browser.click(&row).await;
    browser
        .wait_for(
            "two parked bars",
            "return document.querySelectorAll('#timeline rect.bar.status-needs_approval').length === 2",
        )
        .await;
    let lane = browser
        .script("return [...document.querySelectorAll('#timeline text')].map(t => t.textContent).join('|')")
        .await;
    assert!(lane.as_str().expect("labels").contains(&format!("runner {}", &runner.id.to_string()[..8])), "{lane}");
    let inputs = browser
        .wait_for(
            "the calls' inputs",
            "return document.querySelector(\"#tasks tr[data-task='r1t1']\")?.innerText.includes('\"depth\":2')",
        )
        .await;
    assert_eq!(inputs, true);
    // Pause is offered while it runs; Resume and Regenerate are not.
    let allowed = browser
        .script("return Object.fromEntries([...document.querySelectorAll('#controls button')].map(b => [b.dataset.action, !b.disabled]))")
        .await;
    assert_eq!(allowed, json!({"pause": true, "resume": false, "stop": true, "regenerate": false}));

    // Approve both; the runner runs them and the execution completes.
    browser.click("button[data-approve='r1t0']").await;
    browser
        .wait_for(
            "the second approve button",
            "return document.querySelector(\"button[data-approve='r1t1']\") !== null",
        )
        .await;
    browser.click("button[data-approve='r1t1']").await;
    browser
        .wait_for(
            "the completion",
            "return document.querySelector('#execution-status')?.dataset.status === 'completed'",
        )
        .await;
    browser
        .wait_for(
            "two completed bars",
            "return document.querySelectorAll('#timeline rect.bar.status-completed').length === 2",
        )
        .await;
    let answer = browser.wait_for("the answer", "return document.querySelector('#answer')?.textContent").await;
    assert_eq!(answer, "probe said depth seen on r1t0 and depth seen on r1t1");
    let events = browser.script("return document.querySelectorAll('#events [data-cursor]').length").await;
    let stored = server.store().events_after(run, 0, 1000).await.expect("events").len();
    assert_eq!(events, json!(stored), "the page shows every durable event once");

    for task in ["r1t0", "r1t1"] {
        let row = server.store().task(run, key(task)).await.expect("read").expect("task");
        assert_eq!(row.status, TaskStatus::Completed, "{task}");
    }
    assert_eq!(server.store().execution(run).await.expect("read").expect("row").status, RunStatus::Completed);
    let png = browser.screenshot().await;
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "a PNG");
    let kept = target_dir().join("console-execution.png");
    std::fs::write(&kept, &png).expect("the screenshot is kept");
    eprintln!("screenshot: {}", kept.display());
    browser.quit().await;
    worker.abort();
    server.shutdown().await;
}
