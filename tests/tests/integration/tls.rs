//! The fabric over TLS: certificates made in-process (rcgen), nexus serving TLS on its one port,
//! and a real runner-agent (in-process `nexus_runner_agent::run`) verifying nexus against the test
//! CA, with and without mutual TLS.

use nexus_proto::ErrorCode;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};
use serde_json::{Value, json};
use tempfile::TempDir;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_stream::StreamExt;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

use nexus_actors::config::{ClientAuth, ServerConfig, TlsConfig};
use nexus_proto::agent::v1::agent_service_client::AgentServiceClient;
use nexus_proto::agent::v1::{CreateInputRequest, DeclareProfileRequest, GetExecutionRequest, StreamEventsRequest};
use nexus_runner_agent::{AgentError, ConfigError, TlsOptions};
use nexus_tests::{Minted, TestServer, wait_until};

const WAIT: Duration = Duration::from_secs(30);

/// A CA's certificate file and the issuer that signs with its key.
struct Ca {
    pem: PathBuf,
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// Test certificates on disk: the nexus CA with a server and a runner certificate, and an
/// unrelated CA with a runner certificate of its own.
struct Pki {
    dir: TempDir,
    ca: Ca,
    other_ca: Ca,
    server: (PathBuf, PathBuf),
    runner: (PathBuf, PathBuf),
    stranger: (PathBuf, PathBuf),
}

impl Pki {
    fn new() -> Pki {
        let dir = tempfile::tempdir().expect("temp dir");
        let ca = make_ca(dir.path(), "ca", "nexus test CA");
        let other_ca = make_ca(dir.path(), "other-ca", "some other CA");
        let server =
            make_leaf(dir.path(), "server", &ca, &["127.0.0.1", "localhost"], ExtendedKeyUsagePurpose::ServerAuth);
        let runner = make_leaf(dir.path(), "runner", &ca, &["runner-1"], ExtendedKeyUsagePurpose::ClientAuth);
        let stranger = make_leaf(dir.path(), "stranger", &other_ca, &["runner-x"], ExtendedKeyUsagePurpose::ClientAuth);
        Pki { dir, ca, other_ca, server, runner, stranger }
    }

    /// nexus's `[tls]` section: this server certificate, and mutual TLS when `client_auth` is set.
    fn server_config(&self, client_auth: Option<ClientAuth>) -> TlsConfig {
        TlsConfig {
            cert: Some(self.server.0.clone()),
            key: Some(self.server.1.clone()),
            client_ca: client_auth.map(|_| self.ca.pem.clone()),
            client_auth,
            ..TlsConfig::default()
        }
    }

    fn read(path: &Path) -> Vec<u8> {
        std::fs::read(path).expect("pem")
    }
}

fn make_ca(dir: &Path, name: &str, common_name: &str) -> Ca {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    params.distinguished_name.push(DnType::CommonName, common_name);
    let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().expect("key")).expect("ca");
    let pem = dir.join(format!("{name}.pem"));
    std::fs::write(&pem, issuer.pem()).expect("write ca");
    Ca { pem, issuer }
}

fn make_leaf(dir: &Path, name: &str, ca: &Ca, names: &[&str], usage: ExtendedKeyUsagePurpose) -> (PathBuf, PathBuf) {
    let mut params = CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>()).expect("params");
    params.distinguished_name.push(DnType::CommonName, name);
    params.extended_key_usages = vec![usage];
    let key = KeyPair::generate().expect("key");
    let cert = params.signed_by(&key, &ca.issuer).expect("signed");
    let (cert_path, key_path) = (dir.join(format!("{name}.pem")), dir.join(format!("{name}.key")));
    std::fs::write(&cert_path, cert.pem()).expect("write cert");
    std::fs::write(&key_path, key.serialize_pem()).expect("write key");
    (cert_path, key_path)
}

async fn start_server(pki: &Pki, client_auth: Option<ClientAuth>, scripts: &[(&str, Value)]) -> TestServer {
    let tls = pki.server_config(client_auth);
    TestServer::start_with(scripts, move |config: &mut ServerConfig| config.tls = tls).await
}

/// A runner-agent running in this process, stopped by dropping `stop`.
struct Agent {
    task: JoinHandle<Result<(), AgentError>>,
    stop: oneshot::Sender<()>,
    _dirs: (TempDir, TempDir),
}

impl Agent {
    fn start(server: &TestServer, runner: &Minted, tls: TlsOptions) -> Agent {
        let workdir = tempfile::tempdir().expect("workdir");
        let state = tempfile::tempdir().expect("state");
        let mut config = nexus_tests::agent_config(server.url(), runner, workdir.path(), state.path());
        config.tls = tls;
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(nexus_runner_agent::run(config, async {
            let _ = stopped.await;
        }));
        Agent { task, stop, _dirs: (workdir, state) }
    }

    /// The error the agent stopped with on its own (a final refusal), within the deadline.
    async fn failure(self) -> AgentError {
        let _keep_running = self.stop;
        let result = tokio::time::timeout(WAIT, self.task).await.expect("the agent gives up").expect("joins");
        result.expect_err("the agent fails")
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        self.task.await.expect("joins").expect("the agent stops cleanly");
    }
}

/// runner-agent's TLS options: trust `ca`, present `identity` when given.
fn trust(ca: &Path, identity: Option<&(PathBuf, PathBuf)>) -> TlsOptions {
    TlsOptions {
        ca: Some(ca.to_owned()),
        cert: identity.map(|(cert, _)| cert.clone()),
        key: identity.map(|(_, key)| key.clone()),
        server_name: None,
    }
}

async fn wait_announced(server: &TestServer, runner: &Minted) {
    wait_until("the runner's announcement", WAIT, || async {
        server.store().executor(runner.runner()).await.ok().flatten().and_then(|r| r.announced_at)
    })
    .await;
}

/// A gRPC client of the member doors over TLS, trusting the test CA, without a client
/// certificate.
async fn grpc_client(server: &TestServer, pki: &Pki) -> AgentServiceClient<Channel> {
    let tls = ClientTlsConfig::new().ca_certificate(tonic::transport::Certificate::from_pem(Pki::read(&pki.ca.pem)));
    let channel = Endpoint::from_shared(server.url())
        .expect("url")
        .tls_config(tls)
        .expect("tls")
        .connect()
        .await
        .expect("connect over tls");
    AgentServiceClient::new(channel)
}

fn authed<T>(message: T, member: &Minted) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert("authorization", format!("Bearer {}", member.token).parse().expect("header"));
    request
}

/// An HTTPS client (reqwest on rustls with ring, HTTP/1.1 only) trusting only the test CA.
fn https_client(pki: &Pki, identity: Option<&(PathBuf, PathBuf)>) -> reqwest::Client {
    let ca = reqwest::Certificate::from_pem(&Pki::read(&pki.ca.pem)).expect("ca");
    let mut builder =
        reqwest::Client::builder().use_rustls_tls().tls_built_in_root_certs(false).add_root_certificate(ca);
    if let Some((cert, key)) = identity {
        let mut pem = Pki::read(cert);
        pem.extend(Pki::read(key));
        builder = builder.identity(reqwest::Identity::from_pem(&pem).expect("identity"));
    }
    builder.build().expect("client")
}

#[tokio::test]
async fn an_execution_runs_end_to_end_over_mutual_tls_and_the_doors_answer_over_https() {
    let pki = Pki::new();
    let script = json!({"rounds": [
        {"tool_calls": [{"id": "b", "name": "bash", "arguments": {"command": "echo over-tls"}}]},
        {"final": "bash said {{tool:b.stdout}}"}
    ]});
    let server = start_server(&pki, Some(ClientAuth::Runners), &[("tls", script)]).await;
    assert!(server.url().starts_with("https://127.0.0.1:"), "{}", server.url());
    let agent = server.agent("agent").await;
    let runner = server.runner("worker-1").await;

    // The runner verifies nexus against the test CA and presents its certificate.
    let worker = Agent::start(&server, &runner, trust(&pki.ca.pem, Some(&pki.runner)));
    wait_announced(&server, &runner).await;

    // Members use the gRPC door over TLS with no client certificate (client_auth = "runners").
    let mut client = grpc_client(&server, &pki).await;
    let body = json!({"configuration": {"runner_executor_public_ids": [runner.id], "approval_mode": "bypass", "default_model": "scripted/tls"}});
    client
        .declare_profile(authed(DeclareProfileRequest { body_json: body.to_string() }, &agent))
        .await
        .expect("declare");
    let request = CreateInputRequest { text: "say something".to_owned(), ..CreateInputRequest::default() };
    let execution = client.create_input(authed(request, &agent)).await.expect("input").into_inner().execution_public_id;
    let follow = StreamEventsRequest {
        execution_public_id: execution.clone(),
        after: String::new(),
        follow: true,
        transcript: false,
        progress: false,
    };
    let stream = client.stream_events(authed(follow, &agent)).await.expect("events").into_inner();
    let events = tokio::time::timeout(WAIT, stream.map(|e| e.expect("event")).collect::<Vec<_>>())
        .await
        .expect("the execution ends");
    assert_eq!(events.last().map(|e| e.r#type.as_str()), Some("turn_status"));
    let row = client
        .get_execution(authed(
            GetExecutionRequest { execution_public_id: execution.clone(), tasks_after: String::new() },
            &agent,
        ))
        .await
        .expect("get")
        .into_inner();
    assert_eq!(row.status, "completed");
    assert_eq!(row.final_text.trim_end(), "bash said over-tls");
    let detail: Value = serde_json::from_str(&row.execution_json).expect("json");
    assert_eq!(detail["tasks"][0]["status"], "completed");
    assert_eq!(detail["tasks"][0]["runner_executor_public_id"], json!(runner.id));

    // The HTTP door answers over https to a client that offers only http/1.1 in ALPN.
    let https = https_client(&pki, None);
    let response = https
        .get(format!("{}/agent_api/v1/profile", server.url()))
        .bearer_auth(&agent.token)
        .send()
        .await
        .expect("https request");
    assert_eq!(response.status(), 200);
    assert_eq!(response.version(), reqwest::Version::HTTP_11);
    let profile: Value = response.json().await.expect("json");
    assert_eq!(profile["configuration"]["default_model"], "scripted/tls");
    // Plaintext on the TLS port gets no answer.
    let plaintext = format!("http://{}/agent_api/v1/profile", server.server.addr);
    assert!(reqwest::Client::new().get(plaintext).bearer_auth(&agent.token).send().await.is_err());

    // The runner stream needs a client certificate: without one the hello is refused for good.
    let certless = server.runner("certless").await;
    let refused = Agent::start(&server, &certless, trust(&pki.ca.pem, None)).failure().await;
    assert!(matches!(&refused, AgentError::Refused(refusal) if refusal.code == ErrorCode::Unauthorized), "{refused}");
    // A certificate from another CA fails the handshake itself, with a clear, final error.
    let stranger = server.runner("stranger").await;
    let refused = Agent::start(&server, &stranger, trust(&pki.ca.pem, Some(&pki.stranger))).failure().await;
    assert!(matches!(&refused, AgentError::Tls(_)), "{refused}");
    assert!(refused.to_string().contains(&pki.stranger.0.display().to_string()), "{refused}");
    for id in [certless.runner(), stranger.runner()] {
        let row = server.store().executor(id).await.expect("store").expect("minted");
        assert!(row.announced_at.is_none(), "a refused runner never announced");
    }

    worker.stop().await;
    server.shutdown().await;
}

#[tokio::test]
async fn required_mutual_tls_refuses_every_connection_without_a_client_certificate() {
    let pki = Pki::new();
    let server = start_server(&pki, Some(ClientAuth::Required), &[]).await;
    let agent = server.agent("agent").await;

    let certless = server.runner("certless").await;
    let refused = Agent::start(&server, &certless, trust(&pki.ca.pem, None)).failure().await;
    assert!(matches!(&refused, AgentError::Tls(_)), "{refused}");
    assert!(refused.to_string().contains("--tls-cert"), "the error says what to pass: {refused}");

    let runner = server.runner("worker").await;
    let worker = Agent::start(&server, &runner, trust(&pki.ca.pem, Some(&pki.runner)));
    wait_announced(&server, &runner).await;

    // Members need a certificate too under "required".
    let door = format!("{}/agent_api/v1/profile", server.url());
    assert!(https_client(&pki, None).get(&door).bearer_auth(&agent.token).send().await.is_err());
    let response =
        https_client(&pki, Some(&pki.runner)).get(&door).bearer_auth(&agent.token).send().await.expect("with a cert");
    assert_eq!(response.status(), 200);

    worker.stop().await;
    server.shutdown().await;
}

#[tokio::test]
async fn a_runner_trusting_another_ca_stops_with_a_clear_error() {
    let pki = Pki::new();
    let server = start_server(&pki, None, &[]).await;
    let runner = server.runner("worker").await;

    let refused = Agent::start(&server, &runner, trust(&pki.other_ca.pem, None)).failure().await;
    assert!(matches!(&refused, AgentError::Tls(_)), "{refused}");
    let message = refused.to_string();
    assert!(message.contains(&pki.other_ca.pem.display().to_string()), "names the CA file: {message}");
    let row = server.store().executor(runner.runner()).await.expect("store").expect("minted");
    assert!(row.announced_at.is_none());

    // The same runner trusting the right CA connects.
    let worker = Agent::start(&server, &runner, trust(&pki.ca.pem, None));
    wait_announced(&server, &runner).await;
    worker.stop().await;
    server.shutdown().await;
}

#[tokio::test]
async fn unusable_tls_files_are_refused_at_start_naming_the_file() {
    let pki = Pki::new();
    let missing = pki.dir.path().join("missing.pem");
    let garbage = pki.dir.path().join("garbage.pem");
    std::fs::write(&garbage, "-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n").expect("write");
    let empty = pki.dir.path().join("empty.pem");
    std::fs::write(&empty, "no pem here\n").expect("write");

    // runner-agent: each file option, unreadable or invalid.
    let runner = Minted { id: uuid::Uuid::new_v4(), token: "sk-test".to_owned() };
    let server = start_server(&pki, None, &[]).await;
    let cases: [(TlsOptions, &str, &Path); 4] = [
        (trust(&missing, None), "--tls-ca", &missing),
        (trust(&garbage, None), "--tls-ca", &garbage),
        (trust(&pki.ca.pem, Some(&(empty.clone(), pki.runner.1.clone()))), "--tls-cert", &empty),
        (trust(&pki.ca.pem, Some(&(pki.runner.0.clone(), empty.clone()))), "--tls-key", &empty),
    ];
    for (tls, option, file) in cases {
        let error = Agent::start(&server, &runner, tls).failure().await;
        assert!(
            matches!(&error, AgentError::Config(ConfigError::TlsFile { what, path, .. }) if *what == option && path == file),
            "{option} {}: {error}",
            file.display()
        );
        assert!(error.to_string().contains(&file.display().to_string()), "{error}");
    }
    // An https URL with no CA to verify nexus against is refused before connecting.
    let error = Agent::start(&server, &runner, TlsOptions::default()).failure().await;
    assert!(matches!(error, AgentError::Config(ConfigError::InvalidUrl { .. })), "{error}");
    server.shutdown().await;

    // nexus: a missing certificate or an invalid key stops the start before the store opens.
    for (tls, file) in [
        (TlsConfig { cert: Some(missing.clone()), ..pki.server_config(None) }, &missing),
        (TlsConfig { key: Some(empty.clone()), ..pki.server_config(None) }, &empty),
    ] {
        let data_dir = tempfile::tempdir().expect("data dir");
        let config = ServerConfig { data_dir: data_dir.path().to_owned(), tls, ..ServerConfig::default() };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let error = nexus_actors::start(listener, config).await.expect_err("refused");
        assert!(matches!(error, nexus_actors::ServeError::Tls(_)), "{error}");
        assert!(error.to_string().contains(&file.display().to_string()), "{error}");
        assert!(!data_dir.path().join("nexus.db").exists(), "no store was created");
    }
}

#[tokio::test]
async fn client_auth_without_a_client_ca_is_refused_instead_of_checking_no_certificate() {
    let pki = Pki::new();
    for client_auth in [ClientAuth::Required, ClientAuth::Runners] {
        let tls = TlsConfig { client_ca: None, client_auth: Some(client_auth), ..pki.server_config(None) };
        let data_dir = tempfile::tempdir().expect("data dir");
        let config = ServerConfig { data_dir: data_dir.path().to_owned(), tls, ..ServerConfig::default() };
        // Config validation (what `nexus serve` runs) names the field...
        let invalid = config.validate().expect_err("refused at validation");
        assert!(
            matches!(invalid, nexus_actors::config::ConfigError::Invalid { field: "tls.client_auth", .. }),
            "{invalid}"
        );
        // ...and a start that skipped it still refuses to serve TLS without a client check.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let error = nexus_actors::start(listener, config).await.expect_err("refused at start");
        assert!(
            matches!(error, nexus_actors::ServeError::Tls(nexus_actors::doors::tls::TlsError::ClientAuthWithoutCa(auth)) if auth == client_auth),
            "{error}"
        );
        assert!(!data_dir.path().join("nexus.db").exists(), "no store was created");
    }
}
