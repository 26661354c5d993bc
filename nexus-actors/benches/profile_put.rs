//! What a 1 MiB `PUT /agent_api/v1/profile/configuration` costs, beside a plain `serde_json` parse
//! of the same bytes (issue 3, item 6).
//!
//! A benchmark, not a test: it prints a table and whether the whole PUT stays within
//! [`TARGET_RATIO`] times the plain parse, and it never fails on the ratio. `cargo test` does not
//! run it; run it with `cargo bench -p nexus-actors --bench profile_put`.
//!
//! The body is a deterministic tool list of plain nested function declarations (descriptions and
//! JSON-schema parameters) whose canonical JSON is just under `TOOL_DEFINITIONS_BOUND`. Each phase
//! runs [`WARM_UP`] untimed iterations, then [`ITERATIONS`] timed ones on the same body.

#![expect(clippy::disallowed_methods, reason = "a benchmark measures wall-clock time, with std's Instant")]

use std::hint::black_box;
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};
use tokio::net::TcpListener;
use tokio::runtime::Runtime;

use nexus_actors::actors::profile::profile_json;
use nexus_actors::cli::admin::{MemberKind, create_member};
use nexus_actors::config::{DoorsConfig, ServerConfig};
use nexus_actors::declaration::tools::canonical_tool_definitions_at;
use nexus_actors::declaration::{TOOL_DEFINITIONS_BOUND, validate_profile_put};
use nexus_actors::store::Store;

/// The target: the whole PUT costs at most this many plain parses.
const TARGET_RATIO: f64 = 5.0;
/// Timed iterations per phase.
const ITERATIONS: usize = 30;
/// Untimed iterations per phase before timing (caches, allocator, keep-alive connection).
const WARM_UP: usize = 3;
/// Headroom under the bound, so the list is "just under" 1 MiB of canonical JSON.
const HEADROOM: usize = 4_096;
const FIELD: &str = "configuration.tool_definitions";

/// Nouns for names and prose; verbs for names; filler for prose (space-separated word lists).
const WORDS: &str = "account address archive batch billing bucket cache calendar channel cluster comment contract \
    customer dataset deployment document event file folder invoice issue job ledger message metric note order payment \
    pipeline policy project queue record region release report repository schedule secret service shipment snapshot \
    subscription table task ticket user webhook";
const VERBS: &str = "get list create update delete search archive restore export import approve cancel assign \
    summarize validate sync";
const PROSE: &str = "the a returns matching when only each for with without current caller must may be is set value \
    field identifier optional required results page limit order by newest oldest first includes excludes deleted \
    items workspace scope status if omitted defaults";
const SUFFIXES: &str = "id name filter limit options at";

/// A small deterministic generator (an LCG): the same body on every run, no extra dependency.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> usize {
        self.0 = self.0.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        usize::try_from(self.0 >> 33).unwrap_or(0)
    }

    fn below(&mut self, n: usize) -> usize {
        self.next() % n
    }

    fn pick<'a>(&mut self, words: &'a str) -> &'a str {
        let index = self.below(words.split_whitespace().count());
        words.split_whitespace().nth(index).unwrap_or_default()
    }

    fn sentence(&mut self, low: usize, high: usize) -> String {
        let count = low + self.below(high - low + 1);
        let mut words: Vec<&str> = Vec::with_capacity(count);
        for _ in 0..count {
            let word = if self.below(4) == 0 { self.pick(WORDS) } else { self.pick(PROSE) };
            words.push(word);
        }
        let mut text = words.join(" ");
        if let Some(first) = text.get_mut(0..1) {
            first.make_ascii_uppercase();
        }
        text.push('.');
        text
    }
}

/// One JSON-schema property of a random kind.
fn property(rng: &mut Lcg, depth: usize) -> Value {
    let description = rng.sentence(8, 22);
    match rng.below(if depth == 0 { 6 } else { 5 }) {
        0 => json!({"type": "string", "description": description, "maxLength": 256 + rng.below(4096)}),
        1 => {
            let mut values: Vec<&str> = (0..2 + rng.below(5)).map(|_| rng.pick(WORDS)).collect();
            values.sort_unstable();
            values.dedup();
            json!({"type": "string", "description": description, "enum": values})
        }
        2 => json!({"type": "integer", "description": description, "minimum": 0, "maximum": 1 + rng.below(10_000)}),
        3 => json!({"type": "boolean", "description": description, "default": rng.below(2) == 0}),
        4 => json!({
            "type": "array",
            "description": description,
            "items": {"type": "string", "description": rng.sentence(4, 10)},
            "maxItems": 1 + rng.below(100),
        }),
        _ => {
            let (properties, required) = properties(rng, 2, 4, depth + 1);
            json!({
                "type": "object",
                "description": description,
                "properties": properties,
                "required": required,
                "additionalProperties": false,
            })
        }
    }
}

fn properties(rng: &mut Lcg, low: usize, high: usize, depth: usize) -> (Map<String, Value>, Vec<String>) {
    let mut properties = Map::new();
    let mut required = Vec::new();
    for _ in 0..low + rng.below(high - low + 1) {
        let name = format!("{}_{}", rng.pick(WORDS), rng.pick(SUFFIXES));
        if properties.contains_key(&name) {
            continue;
        }
        if rng.below(2) == 0 {
            required.push(name.clone());
        }
        properties.insert(name, property(rng, depth));
    }
    (properties, required)
}

/// One plain nested function declaration, named `<verb>_<noun>_<index>`.
fn tool(rng: &mut Lcg, index: usize) -> Value {
    let name = format!("{}_{}_{index:04}", rng.pick(VERBS), rng.pick(WORDS));
    let (properties, required) = properties(rng, 3, 8, 0);
    json!({
        "type": "function",
        "function": {
            "name": name,
            "description": rng.sentence(20, 70),
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": required,
                "additionalProperties": false,
            },
            "strict": rng.below(3) == 0,
        },
    })
}

/// The PUT body: a tool list whose canonical JSON stays under the bound by [`HEADROOM`].
fn generate_body() -> Value {
    let mut rng = Lcg(0x6e65_7875_735f_7075);
    let mut tools = Vec::new();
    // `[` and `]`, then each entry plus a comma.
    let mut size = 2;
    loop {
        let entry = tool(&mut rng, tools.len());
        let added = entry.to_string().len() + usize::from(!tools.is_empty());
        if size + added > TOOL_DEFINITIONS_BOUND - HEADROOM {
            break;
        }
        size += added;
        tools.push(entry);
    }
    json!({"configuration": {"tool_definitions": tools, "approval_mode": "bypass"}})
}

#[derive(Clone, Copy)]
struct Stats {
    median: Duration,
    p90: Duration,
}

/// Runs `run` [`WARM_UP`] times untimed, then [`ITERATIONS`] times timed.
fn measure<T>(mut run: impl FnMut() -> T) -> Stats {
    for _ in 0..WARM_UP {
        black_box(run());
    }
    let mut samples: Vec<Duration> = (0..ITERATIONS)
        .map(|_| {
            let started = Instant::now();
            black_box(run());
            started.elapsed()
        })
        .collect();
    samples.sort_unstable();
    // Nearest rank.
    let rank = |p: f64| samples[((p * ITERATIONS as f64).ceil() as usize).clamp(1, ITERATIONS) - 1];
    Stats { median: rank(0.5), p90: rank(0.9) }
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}

fn row(phase: &str, stats: Stats, parse: Stats) {
    let ratio = stats.median.as_secs_f64() / parse.median.as_secs_f64();
    println!("{phase:<57} {:>10.3} {:>10.3} {:>9.2}x", ms(stats.median), ms(stats.p90), ratio);
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let runtime: Runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;

    let body = generate_body();
    let bytes = serde_json::to_vec(&body)?;
    let tool_count = body["configuration"]["tool_definitions"].as_array().map_or(0, Vec::len);
    let canonical = canonical_tool_definitions_at(FIELD, body["configuration"].get("tool_definitions"))?;
    let canonical_len = canonical.to_string().len();
    assert!(canonical_len <= TOOL_DEFINITIONS_BOUND, "the generated list must fit the bound");
    println!(
        "profile_put: {tool_count} tools, body {} bytes, canonical tool_definitions {canonical_len} bytes \
         (bound {TOOL_DEFINITIONS_BOUND}); {WARM_UP} warm-up + {ITERATIONS} timed iterations per phase",
        bytes.len()
    );

    // 1. The plain parse: the yardstick.
    let parse = measure(|| serde_json::from_slice::<Value>(&bytes).expect("the body is JSON"));

    // 2. The grammar: validation and the canonical configuration; the tool list alone beside it.
    let validate = measure(|| validate_profile_put(&body, &|_| Ok(())).expect("the body is valid"));
    let tools = body["configuration"].get("tool_definitions");
    let canonicalize = measure(|| canonical_tool_definitions_at(FIELD, tools).expect("the list is valid"));
    let validated = validate_profile_put(&body, &|_| Ok(()))?;

    // 3. The store write, on a store of its own; its parts beside it.
    let store_dir = tempfile::tempdir()?;
    let (store, member) = runtime.block_on(async {
        let store = Store::open(store_dir.path()).await?;
        let minted = create_member(&store, MemberKind::Agent, "bench").await?;
        let member: nexus_proto::MemberId = minted["public_id"].as_str().unwrap_or_default().parse()?;
        Ok::<_, Box<dyn std::error::Error>>((store, member))
    })?;
    let configuration = &validated.configuration;
    let store_write = measure(|| {
        runtime.block_on(store.declare_profile(member, configuration, None, None)).expect("the store writes")
    });
    let to_text = measure(|| configuration.to_string());
    let read_back = measure(|| runtime.block_on(store.profile(member)).expect("the store reads"));
    let member_row = runtime.block_on(store.member(member))?.ok_or("the bench member vanished")?;
    let profile_row = runtime.block_on(store.profile(member))?.ok_or("the bench profile vanished")?;
    let reply =
        measure(|| serde_json::to_vec(&profile_json(&member_row, Some(profile_row.clone()), 0)).expect("serializes"));

    // 4. The whole PUT through HTTP, on a server of its own.
    let server_dir = tempfile::tempdir()?;
    let config = ServerConfig {
        data_dir: server_dir.path().to_owned(),
        doors: DoorsConfig { requests_per_minute: 1_000_000, burst: 1_000_000, ..DoorsConfig::default() },
        ..ServerConfig::default()
    };
    let (server, token) = runtime.block_on(async {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let server = nexus_actors::start(listener, config).await?;
        let minted = create_member(&server.api.fabric.store, MemberKind::Agent, "bench").await?;
        let token = minted["token"].as_str().unwrap_or_default().to_owned();
        Ok::<_, Box<dyn std::error::Error>>((server, token))
    })?;
    let url = format!("{}/agent_api/v1/profile/configuration", server.url());
    let client = reqwest::Client::new();
    // A 'static body lets every request send the same bytes without a copy.
    let wire: &'static [u8] = Box::leak(bytes.clone().into_boxed_slice());
    let put = || {
        let request = client.put(&url).bearer_auth(&token).header("content-type", "application/json").body(wire);
        async move {
            let response = request.send().await?;
            let status = response.status();
            let reply = response.bytes().await?;
            if !status.is_success() {
                return Err(format!("PUT answered {status}: {}", String::from_utf8_lossy(&reply)).into());
            }
            Ok::<_, Box<dyn std::error::Error>>(reply.len())
        }
    };
    let reply_len = runtime.block_on(put())?;
    let whole = measure(|| runtime.block_on(put()).expect("the PUT succeeds"));
    runtime.block_on(server.shutdown())?;

    println!();
    println!("{:<57} {:>10} {:>10} {:>10}", "phase", "median ms", "p90 ms", "vs parse");
    row("1. plain parse (serde_json::from_slice::<Value>)", parse, parse);
    row("2. validation + canonicalization (validate_profile_put)", validate, parse);
    row("   of which canonical_tool_definitions_at", canonicalize, parse);
    row("3. store write (Store::declare_profile)", store_write, parse);
    row("   of which configuration.to_string()", to_text, parse);
    row("   of which the read-back (Store::profile)", read_back, parse);
    row("   reply body (profile_json + serde_json::to_vec)", reply, parse);
    row("4. whole PUT over HTTP (reqwest, reply read)", whole, parse);
    // Signed: the phases run apart, so heap state and noise can make their sum exceed 4.
    let accounted = ms(parse.median + validate.median + store_write.median + reply.median);
    println!("{:<57} {:>+10.3}", "   4 minus (1 + 2 + 3 + reply): HTTP, auth, actor hop", ms(whole.median) - accounted);
    println!("   reply size: {reply_len} bytes");

    let ratio = whole.median.as_secs_f64() / parse.median.as_secs_f64();
    let verdict = if ratio <= TARGET_RATIO { "holds" } else { "MISSED" };
    println!();
    println!("whole PUT / plain parse (medians) = {ratio:.2}x; target <= {TARGET_RATIO}x: {verdict}");
    Ok(())
}
