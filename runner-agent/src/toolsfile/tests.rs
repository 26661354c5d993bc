use serde_json::json;

use super::*;
use crate::tools::{EffectKind, Idempotency};

const PROFILE: &str = r#"effect_profile = { kind = "read_only", destructive = false, effect_scope = "closed", idempotency = "intrinsic", reconciliation = "none" }"#;

/// A directory holding `tools.toml` with `text`, and a `lint.py` beside it.
fn file_with(text: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tools.toml");
    std::fs::write(&path, text).unwrap();
    std::fs::write(dir.path().join("lint.py"), "print('ok')\n").unwrap();
    (dir, path)
}

fn tool(extra: &str) -> String {
    format!(
        "[[tool]]\nname = \"lint\"\ndescription = \"Lint\"\ncommand = [\"sh\", \"-c\", \"true\"]\n{PROFILE}\n{extra}\n"
    )
}

#[test]
fn the_contract_example_parses_into_typed_config() {
    let text = format!(
        r#"
[[tool]]
name = "lint"
description = "Lint a Python file"
command = ["python3", "lint.py", "--strict"]
timeout_ms = 30000
max_concurrency = 2
env = {{ LINT_STRICT = "1" }}
input_schema = {{ type = "object", properties = {{ path = {{ type = "string" }} }}, required = ["path"] }}
{PROFILE}

[[tool]]
name = "hook"
description = "A stop hook"
command = ["./lint.py"]
effect_profile = {{ kind = "pure", destructive = false, effect_scope = "closed", idempotency = "keyed", reconciliation = "lookup" }}

[[mcp_server]]
name = "files"
prefix = "fs"
command = ["sh", "server.sh"]
env = {{ ROOT = "/srv" }}
timeout_ms = 5000
max_concurrency = 4

[[mcp_server]]
name = "web"
url = "http://127.0.0.1:8931/mcp"
headers_from_env = {{ Authorization = "WEB_MCP_AUTH" }}
default_effect_profile = {{ kind = "read_only", destructive = false, effect_scope = "open", idempotency = "intrinsic", reconciliation = "none" }}

[builtin.bash]
max_concurrency = 2

[builtin.web_fetch]
allow_hosts = ["docs.rs", "*.python.org"]
max_bytes = 2097152
max_concurrency = 3
"#
    );
    let (dir, path) = file_with(&text);
    let base = std::path::absolute(dir.path()).unwrap();
    let file = parse(&path, &text).unwrap();

    let lint = &file.commands[0];
    assert_eq!(lint.name, "lint");
    assert_eq!(lint.program, PathBuf::from("python3"), "a bare name not beside the file is looked up in PATH");
    let script = base.join("lint.py").display().to_string();
    assert_eq!(lint.args, [script.clone(), "--strict".to_owned()], "an argument naming a file beside it resolves");
    assert_eq!(lint.timeout_ms, 30_000);
    assert_eq!(lint.max_concurrency, NonZeroUsize::new(2));
    assert_eq!(lint.env.get("LINT_STRICT").map(String::as_str), Some("1"));
    assert_eq!(lint.input_schema["required"], json!(["path"]));
    assert_eq!(lint.effect_profile.kind, EffectKind::ReadOnly);

    let hook = &file.commands[1];
    assert_eq!(hook.program, base.join("lint.py"), "a relative path resolves against the file's directory");
    assert_eq!(hook.timeout_ms, DEFAULT_TIMEOUT_MS);
    assert_eq!(hook.max_concurrency, None);
    assert_eq!(hook.input_schema, json!({"type": "object"}));
    assert_eq!((hook.effect_profile.kind, hook.effect_profile.idempotency), (EffectKind::Pure, Idempotency::Keyed));

    let [files, web] = file.mcp_servers.as_slice() else { panic!("two servers: {:?}", file.mcp_servers) };
    assert_eq!((files.name.as_str(), files.prefix.as_str(), files.timeout_ms), ("files", "fs", 5_000));
    assert_eq!(files.max_concurrency, NonZeroUsize::new(4));
    assert_eq!(files.default_effect_profile, EffectProfile::UNKNOWN_WRITE);
    let McpTransport::Stdio { command, env } = &files.transport else { panic!("{:?}", files.transport) };
    assert_eq!(command, &["sh".to_owned(), "server.sh".to_owned()], "server.sh is not beside the file: as written");
    assert_eq!(env.get("ROOT").map(String::as_str), Some("/srv"));
    assert_eq!(web.prefix, "web", "the prefix defaults to the name");
    assert_eq!(web.timeout_ms, DEFAULT_TIMEOUT_MS);
    let McpTransport::Http { url, headers_from_env } = &web.transport else { panic!("{:?}", web.transport) };
    assert_eq!(url, "http://127.0.0.1:8931/mcp");
    assert_eq!(headers_from_env.get("Authorization").map(String::as_str), Some("WEB_MCP_AUTH"));
    assert_eq!(web.default_effect_profile.kind, EffectKind::ReadOnly);

    assert_eq!(file.builtins.max_concurrency.get(&Builtin::Bash), NonZeroUsize::new(2).as_ref());
    let web_fetch = file.builtins.web_fetch.as_ref().expect("[builtin.web_fetch]");
    assert_eq!(file.builtins.max_concurrency.get(&Builtin::WebFetch), NonZeroUsize::new(3).as_ref());
    assert_eq!(web_fetch.max_bytes, 2_097_152);
    assert_eq!(web_fetch.allow_hosts, ["docs.rs", "*.python.org"]);
    assert_eq!(web_fetch.timeout_ms, 20_000, "the default");

    // An empty file serves the built-ins alone.
    assert_eq!(parse(&path, "").unwrap(), ToolsFile::default());
}

/// One refusal: the problem, the field and the line (1-based) it names.
struct Refusal {
    requirement: &'static str,
    text: String,
    problem: Problem,
    field: &'static str,
    line: usize,
}

fn row(requirement: &'static str, text: String, problem: Problem, field: &'static str, line: usize) -> Refusal {
    Refusal { requirement, text, problem, field, line }
}

#[test]
fn every_refusal_names_its_line_and_field() {
    let server = |extra: &str| format!("[[mcp_server]]\nname = \"files\"\n{extra}\n");
    let table = [
        row("not toml", "[[tool]\n".to_owned(), Problem::Syntax, "", 1),
        row("unknown top-level key", "tools = 1\n".to_owned(), Problem::Syntax, "tools", 1),
        row("unknown tool key", tool("colour = \"red\""), Problem::Syntax, "tool[0].colour", 6),
        row(
            "missing description",
            format!("[[tool]]\nname = \"x\"\ncommand = [\"sh\"]\n{PROFILE}\n"),
            Problem::Syntax,
            "tool[0]",
            1,
        ),
        row(
            "missing effect profile",
            "[[tool]]\nname = \"x\"\ndescription = \"d\"\ncommand = [\"sh\"]\n".to_owned(),
            Problem::Syntax,
            "tool[0]",
            1,
        ),
        row(
            "an effect profile with a sixth key",
            tool("").replace("reconciliation = \"none\" }", "reconciliation = \"none\", cost = 1 }"),
            Problem::Syntax,
            "tool[0].effect_profile.cost",
            5,
        ),
        row(
            "an effect profile with an unknown word",
            tool("").replace("\"closed\"", "\"sealed\""),
            Problem::Syntax,
            "tool[0].effect_profile.effect_scope",
            5,
        ),
        row("timeout as text", tool("timeout_ms = \"1s\""), Problem::Syntax, "tool[0].timeout_ms", 6),
        row(
            "name outside the rule",
            tool("").replace("\"lint\"", "\"lint.py\""),
            Problem::InvalidName,
            "tool[0].name",
            2,
        ),
        row(
            "name too long",
            tool("").replace("\"lint\"", &format!("\"{}\"", "a".repeat(65))),
            Problem::InvalidName,
            "tool[0].name",
            2,
        ),
        row("a built-in's name", tool("").replace("\"lint\"", "\"bash\""), Problem::InvalidName, "tool[0].name", 2),
        row("skill is reserved", tool("").replace("\"lint\"", "\"skill\""), Problem::InvalidName, "tool[0].name", 2),
        row(
            "a nexus namespace",
            tool("").replace("\"lint\"", "\"delegate_task\""),
            Problem::InvalidName,
            "tool[0].name",
            2,
        ),
        row("a name twice", format!("{}{}", tool(""), tool("")), Problem::DuplicateName, "tool[1].name", 8),
        row(
            "empty description",
            tool("").replace("\"Lint\"", "\"  \""),
            Problem::InvalidDescription,
            "tool[0].description",
            3,
        ),
        row("timeout zero", tool("timeout_ms = 0"), Problem::InvalidTimeout, "tool[0].timeout_ms", 6),
        row("timeout over 7 days", tool("timeout_ms = 604800001"), Problem::InvalidTimeout, "tool[0].timeout_ms", 6),
        row("concurrency zero", tool("max_concurrency = 0"), Problem::InvalidConcurrency, "tool[0].max_concurrency", 6),
        row(
            "schema not an object type",
            tool("input_schema = { type = \"array\" }"),
            Problem::InvalidSchema,
            "tool[0].input_schema",
            6,
        ),
        row(
            "schema without a type",
            tool("input_schema = { properties = {} }"),
            Problem::InvalidSchema,
            "tool[0].input_schema",
            6,
        ),
        row(
            "empty argv",
            tool("").replace("[\"sh\", \"-c\", \"true\"]", "[]"),
            Problem::InvalidCommand,
            "tool[0].command",
            4,
        ),
        row("empty program", tool("").replace("[\"sh\",", "[\"\","), Problem::InvalidCommand, "tool[0].command[0]", 4),
        row(
            "program nowhere",
            tool("").replace("\"sh\"", "\"no-such-program-nexus\""),
            Problem::InvalidCommand,
            "tool[0].command[0]",
            4,
        ),
        row(
            "program path missing",
            tool("").replace("\"sh\"", "\"./missing.sh\""),
            Problem::InvalidCommand,
            "tool[0].command[0]",
            4,
        ),
        row(
            "env sets a runner variable",
            tool("env = { NEXUS_RUNNER_CALL = \"x\" }"),
            Problem::InvalidEnv,
            "tool[0].env.NEXUS_RUNNER_CALL",
            6,
        ),
        row("mcp: neither command nor url", server(""), Problem::InvalidTransport, "mcp_server[0].command", 2),
        row(
            "mcp: both command and url",
            server("command = [\"sh\"]\nurl = \"http://127.0.0.1:1/mcp\""),
            Problem::InvalidTransport,
            "mcp_server[0].url",
            4,
        ),
        row("mcp: url not http", server("url = \"ftp://x\""), Problem::InvalidTransport, "mcp_server[0].url", 3),
        row(
            "mcp: env beside url",
            server("url = \"http://h/mcp\"\nenv = { A = \"b\" }"),
            Problem::InvalidTransport,
            "mcp_server[0].env",
            4,
        ),
        row(
            "mcp: headers beside command",
            server("command = [\"sh\"]\nheaders_from_env = { A = \"B\" }"),
            Problem::InvalidTransport,
            "mcp_server[0].headers_from_env",
            4,
        ),
        row(
            "mcp: a bad header name",
            server("url = \"http://h/mcp\"\nheaders_from_env = { \"a b\" = \"B\" }"),
            Problem::InvalidEnv,
            "mcp_server[0].headers_from_env.a b",
            4,
        ),
        row(
            "mcp: name too long",
            server("url = \"http://h\"").replace("\"files\"", &format!("\"{}\"", "s".repeat(33))),
            Problem::InvalidName,
            "mcp_server[0].name",
            2,
        ),
        row(
            "mcp: a bad prefix",
            server("prefix = \"f.s\"\nurl = \"http://h\""),
            Problem::InvalidName,
            "mcp_server[0].prefix",
            3,
        ),
        row(
            "mcp: a name twice",
            format!("{}{}", server("url = \"http://h\""), server("url = \"http://h\"")),
            Problem::DuplicateName,
            "mcp_server[1].name",
            5,
        ),
        row(
            "mcp: a prefix twice",
            format!(
                "{}[[mcp_server]]\nname = \"other\"\nprefix = \"files\"\nurl = \"http://h\"\n",
                server("url = \"http://h\"")
            ),
            Problem::DuplicateName,
            "mcp_server[1].prefix",
            6,
        ),
        row(
            "mcp: timeout zero",
            server("url = \"http://h\"\ntimeout_ms = 0"),
            Problem::InvalidTimeout,
            "mcp_server[0].timeout_ms",
            4,
        ),
        row("mcp: unknown key", server("url = \"http://h\"\nretries = 3"), Problem::Syntax, "mcp_server[0].retries", 4),
        row(
            "builtin: unknown tool",
            "[builtin.python]\nmax_concurrency = 1\n".to_owned(),
            Problem::UnknownBuiltin,
            "builtin.python",
            1,
        ),
        row(
            "builtin: unknown key",
            "[builtin.bash]\ntimeout_ms = 5\n".to_owned(),
            Problem::UnknownBuiltin,
            "builtin.bash.timeout_ms",
            2,
        ),
        row(
            "builtin: concurrency zero",
            "[builtin.read_file]\nmax_concurrency = 0\n".to_owned(),
            Problem::InvalidConcurrency,
            "builtin.read_file.max_concurrency",
            2,
        ),
        row(
            "web_fetch: no allow_hosts",
            "\n[builtin.web_fetch]\nmax_bytes = 10\n".to_owned(),
            Problem::InvalidWebFetch,
            "builtin.web_fetch",
            2,
        ),
        row(
            "web_fetch: an empty allowlist",
            "[builtin.web_fetch]\nallow_hosts = []\n".to_owned(),
            Problem::InvalidWebFetch,
            "builtin.web_fetch",
            1,
        ),
        row(
            "web_fetch: a host with a scheme",
            "[builtin.web_fetch]\nallow_hosts = [\"https://docs.rs\"]\n".to_owned(),
            Problem::InvalidWebFetch,
            "builtin.web_fetch",
            1,
        ),
        row(
            "web_fetch: an unknown key",
            "[builtin.web_fetch]\nallow_hosts = [\"docs.rs\"]\nproxy = \"x\"\n".to_owned(),
            Problem::InvalidWebFetch,
            "builtin.web_fetch",
            1,
        ),
        row(
            "web_fetch: a bound too large",
            "[builtin.web_fetch]\nallow_hosts = [\"docs.rs\"]\ntimeout_ms = 300001\n".to_owned(),
            Problem::InvalidWebFetch,
            "builtin.web_fetch",
            1,
        ),
        row(
            "builtin: concurrency as text",
            "[builtin.web_fetch]\nmax_concurrency = \"2\"\n".to_owned(),
            Problem::InvalidConcurrency,
            "builtin.web_fetch.max_concurrency",
            2,
        ),
    ];
    for Refusal { requirement, text, problem, field, line } in table {
        let (_dir, path) = file_with(&text);
        let Err(err) = parse(&path, &text) else { panic!("{requirement}: accepted\n{text}") };
        assert_eq!(err.problem, problem, "{requirement}: {err}");
        assert_eq!(err.field.as_deref().unwrap_or(""), field, "{requirement}: {err}");
        assert_eq!(err.location.map(|(line, _)| line), Some(line), "{requirement}: {err}");
        assert_eq!(err.path, path, "{requirement}");
        let shown = err.to_string();
        assert!(shown.starts_with(&format!("tools file {}:{line}:", path.display())), "{requirement}: {shown}");
    }
}

#[test]
fn columns_count_characters_and_the_file_is_read_with_its_digest() {
    assert_eq!(line_column("ab\ncdé f", 0), (1, 1));
    assert_eq!(line_column("ab\ncdé f", 3), (2, 1));
    assert_eq!(line_column("ab\ncdé f", 7), (2, 4), "é is one column");
    assert_eq!(line_column("ab", 99), (1, 3), "an offset past the end is the end");

    let text = tool("timeout_ms = 0");
    let (_dir, path) = file_with(&text);
    let err = load(&path).unwrap_err();
    assert_eq!(err.location, Some((6, 14)), "the value, not the key: {err}");

    let good = tool("");
    std::fs::write(&path, &good).unwrap();
    let (file, digest) = load(&path).unwrap();
    assert_eq!(file.commands.len(), 1);
    assert_eq!(digest, <[u8; 32]>::from(Sha256::digest(good.as_bytes())));

    let missing = load(&path.with_file_name("absent.toml")).unwrap_err();
    assert_eq!((missing.problem, missing.location, missing.field), (Problem::Unreadable, None, None));
    std::fs::write(&path, [0xff, 0xfe]).unwrap();
    assert_eq!(load(&path).unwrap_err().problem, Problem::Unreadable, "not UTF-8");
}

#[test]
fn tool_names_follow_the_provider_rule_and_keep_out_of_reserved_ones() {
    for name in ["lint", "a", "A-b_9", &"x".repeat(64)] {
        assert_eq!(tool_name_problem(name), None, "{name}");
    }
    for name in ["", "a.b", "a b", "é", &"x".repeat(65), "bash", "read_file", "skill", "web_fetch", "delegate_task"] {
        assert!(tool_name_problem(name).is_some(), "{name}");
    }
}

#[test]
fn the_deploy_example_parses() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/examples/runner-tools.toml");
    let (file, _) = load(&path).unwrap();
    let names: Vec<&str> = file.commands.iter().map(|tool| tool.name.as_str()).collect();
    assert_eq!(names, ["word_count", "stop_hook"]);
    assert_eq!(file.mcp_servers[0].prefix, "docs");
    assert_eq!(file.builtins.max_concurrency.get(&Builtin::Bash), NonZeroUsize::new(2).as_ref());
}

#[test]
fn only_a_regular_file_is_read_and_never_past_the_bound() {
    let dir = tempfile::tempdir().unwrap();
    // A device that never ends, and a FIFO nobody writes: refused at once, nothing read.
    let zero = dir.path().join("zero.toml");
    std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
    let fifo = dir.path().join("fifo.toml");
    assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    for path in [&zero, &fifo, &dir.path().to_owned()] {
        let err = read(path).unwrap_err();
        assert_eq!(err.problem, Problem::Unreadable, "{}: {err}", path.display());
        assert!(err.reason.contains("not a regular file"), "{err}");
    }
    let big = dir.path().join("big.toml");
    std::fs::write(&big, vec![b'#'; usize::try_from(MAX_FILE_BYTES).unwrap() + 1]).unwrap();
    assert!(read(&big).unwrap_err().reason.contains("more than"));
}
