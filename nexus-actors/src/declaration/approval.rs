//! `approval_mode` and `approval_rules`: their declaration grammar and the pure evaluator of the
//! approval stage (`docs/declaration.md`, "Approval rules"; `docs/executions.md`, "Approval").
//!
//! A rule is `{tool, verdict, path?, match?, reason?, origin?}` (at most 6 keys). `tool` is a
//! `|`-separated list of anchored globs over the resolved wire tool name; `match` is an anchored
//! glob over the text found at the dotted `path` inside the tool input. In both, only `*`
//! (anything, newlines included) and `?` (exactly one byte) are special.

use serde_json::Value;

use nexus_proto::Refusal;

use super::{ENVELOPE_BOUND, invalid};

/// The keys a rule may carry; a rule has at most this many keys.
pub const RULE_KEYS: [&str; 6] = ["tool", "verdict", "path", "match", "reason", "origin"];
/// How many bytes of a deny rule's `reason` become `error.detail`.
pub const REASON_BOUND: usize = 256;

/// The approval mode frozen on an execution: `bypass | ask | rules`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ApprovalMode {
    /// Everything not denied by a rule is granted (origin `mode`).
    Bypass,
    /// Allow rules grant (origin `rule`); everything else not denied parks for a human.
    Ask,
    /// Allow rules grant, ask rules park, and an unmatched call is denied.
    Rules,
}

impl ApprovalMode {
    /// Parses the declared word; `None` outside the vocabulary.
    pub fn parse(word: &str) -> Option<Self> {
        match word {
            "bypass" => Some(ApprovalMode::Bypass),
            "ask" => Some(ApprovalMode::Ask),
            "rules" => Some(ApprovalMode::Rules),
            _ => None,
        }
    }

    /// The declared word.
    pub fn as_str(self) -> &'static str {
        match self {
            ApprovalMode::Bypass => "bypass",
            ApprovalMode::Ask => "ask",
            ApprovalMode::Rules => "rules",
        }
    }
}

/// A rule's verdict. The order is the precedence: `Deny > Ask > Allow`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Verdict {
    /// `allow`
    Allow,
    /// `ask`
    Ask,
    /// `deny`
    Deny,
}

impl Verdict {
    /// Parses a rule's `verdict`; `None` outside `allow | ask | deny`.
    pub fn parse(word: &str) -> Option<Self> {
        match word {
            "allow" => Some(Verdict::Allow),
            "ask" => Some(Verdict::Ask),
            "deny" => Some(Verdict::Deny),
            _ => None,
        }
    }
}

/// Where a tool call came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CallOrigin {
    /// A model fan, task operation or `delegate_task` graph row.
    Model,
    /// A row appended through the tasks door.
    Author,
    /// A continuation, summarizer, ask or hook.
    Kernel,
}

impl CallOrigin {
    /// Parses a rule's `origin`; `None` outside `model | author | kernel`.
    pub fn parse(word: &str) -> Option<Self> {
        match word {
            "model" => Some(CallOrigin::Model),
            "author" => Some(CallOrigin::Author),
            "kernel" => Some(CallOrigin::Kernel),
            _ => None,
        }
    }
}

/// The strongest rule that matched a call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleMatch {
    /// The winning verdict (deny over ask over allow).
    pub verdict: Verdict,
    /// The first matching rule of that verdict's `reason`, cut to [`REASON_BOUND`] bytes.
    pub reason: Option<String>,
}

/// Who granted a call, as recorded in the `approval` fact's `origin`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GrantOrigin {
    /// `mode`: the approval mode granted it.
    Mode,
    /// `rule`: an allow rule granted it.
    Rule,
    /// `author`: an author row, pre-approved.
    Author,
    /// `kernel`: a kernel row, pre-approved.
    Kernel,
}

impl GrantOrigin {
    /// The fact's word.
    pub fn as_str(self) -> &'static str {
        match self {
            GrantOrigin::Mode => "mode",
            GrantOrigin::Rule => "rule",
            GrantOrigin::Author => "author",
            GrantOrigin::Kernel => "kernel",
        }
    }
}

/// The approval stage's answer for one call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Run it.
    Grant(GrantOrigin),
    /// Park the task in `needs_approval`.
    Park,
    /// Fail it with `approval_denied`; the reason becomes `error.detail`.
    Deny {
        /// The deny rule's reason, or `no approval rule allows NAME` under `rules`.
        reason: Option<String>,
    },
}

/// Validates `approval_rules` (null or an array of rules, at most 64 KiB as JSON).
///
/// # Errors
/// 422 `validation_failed` naming `field` or the rule's key (`field[i].key`).
pub(super) fn validate_rules(value: Option<&Value>, field: &str) -> Result<(), Refusal> {
    let rules = match value {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::Array(rules)) => rules,
        Some(_) => return Err(invalid(field, "must be null or an array of rule objects")),
    };
    let size = Value::Array(rules.clone()).to_string().len();
    if size > ENVELOPE_BOUND {
        return Err(invalid(field, format!("the rule list is {size} bytes, over its bound of {ENVELOPE_BOUND}")));
    }
    for (i, rule) in rules.iter().enumerate() {
        let at = format!("{field}[{i}]");
        let Some(rule) = rule.as_object() else { return Err(invalid(&at, "a rule must be an object")) };
        if rule.len() > RULE_KEYS.len() {
            return Err(invalid(&at, "a rule has at most 6 keys: tool, verdict, path, match, reason, origin"));
        }
        if let Some(key) = rule.keys().find(|k| !RULE_KEYS.contains(&k.as_str())) {
            return Err(invalid(
                &format!("{at}.{key}"),
                "unknown key; a rule takes tool, verdict, path, match, reason, origin",
            ));
        }
        match rule.get("tool") {
            None | Some(Value::Null) => return Err(invalid(&format!("{at}.tool"), "is required")),
            Some(Value::String(tool)) => {
                if let Err(detail) = compile_tool_globs(tool) {
                    return Err(invalid(&format!("{at}.tool"), detail));
                }
            }
            Some(_) => return Err(invalid(&format!("{at}.tool"), "must be a string of |-separated globs")),
        }
        if rule.get("verdict").and_then(Value::as_str).and_then(Verdict::parse).is_none() {
            return Err(invalid(&format!("{at}.verdict"), "is required and must be allow, ask or deny"));
        }
        if let Some(origin) = rule.get("origin")
            && origin.as_str().and_then(CallOrigin::parse).is_none()
        {
            return Err(invalid(&format!("{at}.origin"), "must be model, author or kernel"));
        }
        if let Some(path) = rule.get("path") {
            let Some(path) = path.as_str() else {
                return Err(invalid(&format!("{at}.path"), "must be a dotted key path string"));
            };
            if path.split('.').any(str::is_empty) {
                return Err(invalid(&format!("{at}.path"), "has an empty segment; write keys joined by single dots"));
            }
        }
        if let Some(glob) = rule.get("match") {
            if !rule.contains_key("path") {
                return Err(invalid(&format!("{at}.match"), "requires path"));
            }
            let Some(glob) = glob.as_str() else {
                return Err(invalid(&format!("{at}.match"), "must be a glob string"));
            };
            if glob.contains('\0') {
                return Err(invalid(&format!("{at}.match"), "the glob does not compile: it contains NUL"));
            }
        }
        if rule.get("reason").is_some_and(|r| !r.is_string()) {
            return Err(invalid(&format!("{at}.reason"), "must be a string"));
        }
    }
    Ok(())
}

/// Validates `approval_mode`; `needed` says the declaration has tools, kernel tools, hooks or
/// runner imports, which make the mode required.
///
/// # Errors
/// 422 `validation_failed` naming `field`.
pub(super) fn validate_mode(value: Option<&Value>, field: &str, needed: bool) -> Result<(), Refusal> {
    match value {
        None | Some(Value::Null) if needed => {
            Err(invalid(field, "is required when the profile declares tools, kernel tools, hooks or runner imports"))
        }
        None | Some(Value::Null) => Ok(()),
        Some(Value::String(mode)) if ApprovalMode::parse(mode).is_some() => Ok(()),
        Some(_) => Err(invalid(field, "must be bypass, ask or rules")),
    }
}

fn compile_tool_globs(tool: &str) -> Result<(), String> {
    if tool.contains('\0') {
        return Err("the glob does not compile: it contains NUL".to_owned());
    }
    if tool.split('|').any(str::is_empty) {
        return Err("the glob does not compile: every |-separated alternative must be non-empty".to_owned());
    }
    Ok(())
}

/// Matches `text` against an anchored glob where only `*` (any bytes, newlines included) and `?`
/// (exactly one byte) are special.
///
/// The work is bounded, whatever the input (`docs/declaration.md`, "Approval rules"): the glob is
/// cut at its stars into segments; the first must match at the start, the last at the end, and
/// each one between at its leftmost place after the one before (which is exact for globs with
/// only `*` and `?`). A segment without `?` is found by Knuth–Morris–Pratt, in at most twice the
/// text's length in steps; a segment with `?` by a bit-parallel scan, in the text's length times
/// one step per 64 bytes of the segment. So a rule at its 64 KiB bound against a 64 KiB input
/// costs at most about 2^26 word steps, never the product of the two lengths in backtracking.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    glob_match_counted(pattern.as_bytes(), text.as_bytes(), &mut 0)
}

/// [`glob_match`] over bytes, adding the steps it takes to `steps` (the tests bound them).
fn glob_match_counted(pattern: &[u8], text: &[u8], steps: &mut u64) -> bool {
    let segments: Vec<&[u8]> = pattern.split(|&c| c == b'*').collect();
    let (first, last) = (segments[0], segments[segments.len() - 1]);
    if segments.len() == 1 {
        return first.len() == text.len() && segment_at(first, text, steps);
    }
    if text.len() < first.len() + last.len() {
        return false;
    }
    let tail = text.len() - last.len();
    if !segment_at(first, &text[..first.len()], steps) || !segment_at(last, &text[tail..], steps) {
        return false;
    }
    let mut rest = &text[first.len()..tail];
    for segment in segments[1..segments.len() - 1].iter().filter(|segment| !segment.is_empty()) {
        let found =
            if segment.contains(&b'?') { find_wild(segment, rest, steps) } else { find_literal(segment, rest, steps) };
        match found {
            Some(end) => rest = &rest[end..],
            None => return false,
        }
    }
    true
}

/// Whether `segment` (no `*`) matches `window`, of the same length, byte for byte.
fn segment_at(segment: &[u8], window: &[u8], steps: &mut u64) -> bool {
    *steps += segment.len() as u64;
    segment.len() == window.len() && segment.iter().zip(window).all(|(&p, &t)| p == b'?' || p == t)
}

/// The end of the leftmost occurrence of `segment` (non-empty, no wildcard) in `text`, by
/// Knuth–Morris–Pratt: at most `2 × (segment + text)` steps.
fn find_literal(segment: &[u8], text: &[u8], steps: &mut u64) -> Option<usize> {
    let mut border = vec![0usize; segment.len()];
    let mut k = 0;
    for i in 1..segment.len() {
        while k > 0 && segment[i] != segment[k] {
            *steps += 1;
            k = border[k - 1];
        }
        *steps += 1;
        if segment[i] == segment[k] {
            k += 1;
        }
        border[i] = k;
    }
    let mut matched = 0;
    for (i, &byte) in text.iter().enumerate() {
        while matched > 0 && segment[matched] != byte {
            *steps += 1;
            matched = border[matched - 1];
        }
        *steps += 1;
        if segment[matched] == byte {
            matched += 1;
            if matched == segment.len() {
                return Some(i + 1);
            }
        }
    }
    None
}

/// The end of the leftmost occurrence of `segment` (non-empty, no `*`, some `?`) in `text`, by a
/// bit-parallel scan (shift-and): bit `j` of the state says the last `j + 1` bytes match the
/// segment's first `j + 1`. One step per text byte and 64-byte word of the segment.
fn find_wild(segment: &[u8], text: &[u8], steps: &mut u64) -> Option<usize> {
    const BITS: usize = u64::BITS as usize;
    let words = segment.len().div_ceil(BITS);
    // The masks only of the bytes the segment names; any other byte matches the `?`s alone.
    let mut slot = [usize::MAX; 256];
    let mut masks: Vec<Vec<u64>> = Vec::new();
    let mut wild = vec![0u64; words];
    for (j, &byte) in segment.iter().enumerate() {
        *steps += 1;
        if byte == b'?' {
            wild[j / BITS] |= 1 << (j % BITS);
            continue;
        }
        if slot[usize::from(byte)] == usize::MAX {
            slot[usize::from(byte)] = masks.len();
            masks.push(vec![0u64; words]);
        }
        masks[slot[usize::from(byte)]][j / BITS] |= 1 << (j % BITS);
    }
    let (last_word, last_bit) = ((segment.len() - 1) / BITS, (segment.len() - 1) % BITS);
    let mut state = vec![0u64; words];
    for (i, &byte) in text.iter().enumerate() {
        let literal = masks.get(slot[usize::from(byte)]);
        let mut carry = 1u64;
        for w in 0..words {
            *steps += 1;
            let shifted = (state[w] << 1) | carry;
            carry = state[w] >> (BITS - 1);
            state[w] = shifted & (wild[w] | literal.map_or(0, |mask| mask[w]));
        }
        if state[last_word] & (1 << last_bit) != 0 {
            return Some(i + 1);
        }
    }
    None
}

/// The text a rule's `path` finds in `input`: a string as-is, or an array of scalars joined by one
/// space. Objects are walked by key and arrays by integer index; anything else has no text.
pub fn text_at(input: &Value, path: &str) -> Option<String> {
    let mut node = input;
    for segment in path.split('.') {
        node = match node {
            Value::Object(map) => map.get(segment)?,
            Value::Array(items) => items.get(segment.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    match node {
        Value::String(text) => Some(text.clone()),
        Value::Array(items) => {
            let parts = items
                .iter()
                .map(|item| match item {
                    Value::String(s) => Some(s.clone()),
                    Value::Number(n) => Some(n.to_string()),
                    Value::Bool(b) => Some(b.to_string()),
                    _ => None,
                })
                .collect::<Option<Vec<_>>>()?;
            Some(parts.join(" "))
        }
        _ => None,
    }
}

fn rule_matches(rule: &serde_json::Map<String, Value>, tool_name: &str, input: &Value, origin: CallOrigin) -> bool {
    let rule_origin =
        rule.get("origin").and_then(Value::as_str).and_then(CallOrigin::parse).unwrap_or(CallOrigin::Model);
    if rule_origin != origin {
        return false;
    }
    let Some(tools) = rule.get("tool").and_then(Value::as_str) else { return false };
    if !tools.split('|').any(|glob| glob_match(glob, tool_name)) {
        return false;
    }
    let Some(path) = rule.get("path").and_then(Value::as_str) else { return true };
    let Some(text) = text_at(input, path) else { return false };
    rule.get("match").and_then(Value::as_str).is_none_or(|glob| glob_match(glob, &text))
}

/// The first [`REASON_BOUND`] bytes of `reason`, cut back to a character boundary: what becomes
/// `error.detail` (a deny rule's `reason`, or a person's denial reason).
pub fn cut_reason(reason: &str) -> String {
    let mut end = reason.len().min(REASON_BOUND);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    reason[..end].to_owned()
}

/// Collects every rule in `rules` (a validated `approval_rules` value; null matches nothing) that
/// matches a call of `tool_name` (the resolved wire name) with `input` from `origin`, and returns
/// the strongest: deny over ask over allow. `None` when nothing matches.
pub fn evaluate(rules: &Value, tool_name: &str, input: &Value, origin: CallOrigin) -> Option<RuleMatch> {
    let mut best: Option<RuleMatch> = None;
    for rule in rules.as_array().into_iter().flatten().filter_map(Value::as_object) {
        let Some(verdict) = rule.get("verdict").and_then(Value::as_str).and_then(Verdict::parse) else { continue };
        if !rule_matches(rule, tool_name, input, origin) {
            continue;
        }
        if best.as_ref().is_none_or(|b| verdict > b.verdict) {
            let reason = rule.get("reason").and_then(Value::as_str).map(cut_reason);
            best = Some(RuleMatch { verdict, reason });
        }
    }
    best
}

/// The approval stage for one call: the rule verdict under the mode table (`docs/executions.md`,
/// "Approval").
///
/// `author` and `kernel` calls are pre-approved unless a rule naming their origin denies them or
/// says ask. A `model` call follows the mode:
///
/// | mode | deny | allow | ask | unmatched |
/// |---|---|---|---|---|
/// | bypass | Deny | Grant(mode) | Grant(mode) | Grant(mode) |
/// | ask | Deny | Grant(rule) | Park | Park |
/// | rules | Deny | Grant(rule) | Park | Deny "no approval rule allows NAME" |
pub fn decide(mode: ApprovalMode, rules: &Value, tool_name: &str, input: &Value, origin: CallOrigin) -> Decision {
    let matched = evaluate(rules, tool_name, input, origin);
    if let Some(RuleMatch { verdict: Verdict::Deny, reason }) = &matched {
        return Decision::Deny { reason: reason.clone() };
    }
    let verdict = matched.map(|m| m.verdict);
    match origin {
        CallOrigin::Author | CallOrigin::Kernel if verdict == Some(Verdict::Ask) => Decision::Park,
        CallOrigin::Author => Decision::Grant(GrantOrigin::Author),
        CallOrigin::Kernel => Decision::Grant(GrantOrigin::Kernel),
        CallOrigin::Model => match (mode, verdict) {
            (ApprovalMode::Bypass, _) => Decision::Grant(GrantOrigin::Mode),
            (_, Some(Verdict::Allow)) => Decision::Grant(GrantOrigin::Rule),
            (ApprovalMode::Ask, _) | (ApprovalMode::Rules, Some(_)) => Decision::Park,
            (ApprovalMode::Rules, None) => {
                Decision::Deny { reason: Some(format!("no approval rule allows {tool_name}")) }
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use nexus_proto::ErrorCode;

    const FIELD: &str = "configuration.approval_rules";

    fn refusal(rules: Value) -> String {
        let refusal = validate_rules(Some(&rules), FIELD).expect_err("refused");
        assert_eq!(refusal.code, ErrorCode::ValidationFailed);
        refusal.message
    }

    #[test]
    fn r68_rule_grammar_refusals() {
        let cases = [
            ("not_an_array", json!({"tool": "bash"}), FIELD),
            ("rule_not_object", json!(["bash"]), "configuration.approval_rules[0]"),
            (
                "seventh_key",
                json!([{"tool": "a", "verdict": "deny", "path": "p", "match": "*", "reason": "r", "origin": "model", "x": 1}]),
                "configuration.approval_rules[0]: a rule has at most 6 keys",
            ),
            (
                "unknown_key",
                json!([{"tool": "a", "verdict": "deny", "note": 1}]),
                "configuration.approval_rules[0].note",
            ),
            ("missing_tool", json!([{"verdict": "deny"}]), "configuration.approval_rules[0].tool: is required"),
            ("tool_not_string", json!([{"tool": 3, "verdict": "deny"}]), "configuration.approval_rules[0].tool"),
            (
                "empty_alternative",
                json!([{"tool": "bash|", "verdict": "deny"}]),
                "configuration.approval_rules[0].tool",
            ),
            ("empty_tool", json!([{"tool": "", "verdict": "deny"}]), "configuration.approval_rules[0].tool"),
            ("nul_in_tool", json!([{"tool": "a\u{0}", "verdict": "deny"}]), "configuration.approval_rules[0].tool"),
            ("missing_verdict", json!([{"tool": "a"}]), "configuration.approval_rules[0].verdict"),
            ("verdict_outside", json!([{"tool": "a", "verdict": "maybe"}]), "configuration.approval_rules[0].verdict"),
            (
                "origin_outside",
                json!([{"tool": "a", "verdict": "deny", "origin": "human"}]),
                "configuration.approval_rules[0].origin",
            ),
            (
                "match_without_path",
                json!([{"tool": "a", "verdict": "deny", "match": "*"}]),
                "configuration.approval_rules[0].match: requires path",
            ),
            (
                "empty_path_segment",
                json!([{"tool": "a", "verdict": "deny", "path": "a..b"}]),
                "configuration.approval_rules[0].path",
            ),
            (
                "match_nul",
                json!([{"tool": "a", "verdict": "deny", "path": "a", "match": "\u{0}"}]),
                "configuration.approval_rules[0].match",
            ),
            (
                "reason_not_string",
                json!([{"tool": "a", "verdict": "deny", "reason": 1}]),
                "configuration.approval_rules[0].reason",
            ),
            (
                "second_rule_named",
                json!([{"tool": "a", "verdict": "deny"}, {"tool": "a", "verdict": "nope"}]),
                "configuration.approval_rules[1].verdict",
            ),
            (
                "over_64_kib",
                json!([{"tool": "a", "verdict": "deny", "reason": "r".repeat(ENVELOPE_BOUND)}]),
                "configuration.approval_rules: the rule list is",
            ),
        ];
        for (name, rules, prefix) in cases {
            let message = refusal(rules);
            assert!(message.starts_with(prefix), "{name}: {message} should start with {prefix}");
        }
    }

    #[test]
    fn r68_rule_grammar_accepts() {
        let ok = [
            json!(null),
            json!([]),
            json!([{ "tool": "bash|start_process", "path": "command", "match": "*rm -rf /*", "verdict": "deny" }]),
            json!([{"tool": "*", "verdict": "allow", "origin": "kernel", "reason": "hooks", "path": "a.0"}]),
            json!([{"tool": "read_?", "verdict": "ask", "path": "files", "match": ""}]),
        ];
        for rules in ok {
            assert_eq!(validate_rules(Some(&rules), FIELD), Ok(()), "{rules}");
        }
        assert_eq!(validate_rules(None, FIELD), Ok(()));
    }

    #[test]
    fn r12_mode_vocabulary_and_requirement() {
        let field = "configuration.approval_mode";
        for word in ["bypass", "ask", "rules"] {
            assert_eq!(validate_mode(Some(&json!(word)), field, true), Ok(()));
            assert_eq!(ApprovalMode::parse(word).map(ApprovalMode::as_str), Some(word));
        }
        for (value, needed) in [(json!("sometimes"), false), (json!(1), false), (json!(null), true)] {
            let refusal = validate_mode(Some(&value), field, needed).expect_err("refused");
            assert_eq!(refusal.code, ErrorCode::ValidationFailed);
            assert!(refusal.message.starts_with(field));
        }
        assert_eq!(validate_mode(None, field, false), Ok(()));
        assert!(validate_mode(None, field, true).is_err());
    }

    #[test]
    fn r68_globs_only_star_and_question_mark() {
        let rows = [
            ("*rm -rf /*", "sudo rm -rf / --no-preserve-root", true),
            ("*rm -rf /*", "rm -rf ./build", false),
            ("bash", "bash", true),
            ("bash", "bash2", false),
            ("ba?h", "bash", true),
            ("ba?h", "bh", false),
            ("*", "", true),
            ("a*b*c", "a\nxb\nyc", true),
            ("a*b*c", "acb", false),
            ("[ab]", "[ab]", true),
            ("[ab]", "a", false),
            ("a.c", "abc", false),
            ("?", "é", false),
            ("??", "é", true),
            ("**x", "yyx", true),
        ];
        for (pattern, text, expected) in rows {
            assert_eq!(glob_match(pattern, text), expected, "{pattern:?} against {text:?}");
        }
    }

    #[test]
    fn globs_agree_with_the_plain_reading() {
        // A fixed-seed generator over a small alphabet, so stars, marks and repeats collide.
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move |bound: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % bound
        };
        let alphabet = [b'a', b'b', b'*', b'?'];
        for _ in 0..20_000 {
            let pattern: Vec<u8> = (0..next(9)).map(|_| alphabet[next(4) as usize]).collect();
            let text: Vec<u8> = (0..next(12)).map(|_| alphabet[next(2) as usize]).collect();
            let (pattern, text) = (String::from_utf8(pattern).unwrap(), String::from_utf8(text).unwrap());
            assert_eq!(
                glob_match(&pattern, &text),
                crate::fuzzing::plain_glob(pattern.as_bytes(), text.as_bytes()),
                "{pattern:?} against {text:?}"
            );
        }
        // Segments longer than one 64-bit word of the bit-parallel scan.
        let long = format!("*{}?b*", "a".repeat(100));
        assert!(glob_match(&long, &format!("x{}zb", "a".repeat(100))));
        assert!(!glob_match(&long, &format!("x{}b", "a".repeat(100))));
        assert!(glob_match(&format!("*{}*", "a?".repeat(70)), &"ab".repeat(200)));
    }

    /// A star and a long near-miss segment against a long command cost the backtracking matcher
    /// the product of the two lengths (about 1.8e9 steps, 27 CPU-seconds, here); the bounded
    /// matcher takes a few steps per byte.
    #[test]
    fn glob_work_is_bounded_on_hostile_rules() {
        let command = "a".repeat(60_000);
        let mut steps = 0;
        let pattern = format!("*{}b", "a".repeat(30_000));
        assert!(!glob_match_counted(pattern.as_bytes(), command.as_bytes(), &mut steps));
        assert!(steps <= 2 * (60_000 + 30_000), "{steps} steps");

        let mut steps = 0;
        let pattern = format!("*{}b*", "a".repeat(30_000));
        assert!(!glob_match_counted(pattern.as_bytes(), command.as_bytes(), &mut steps));
        assert!(steps <= 2 * (60_000 + 30_000), "{steps} steps");

        // With `?` the scan costs one step per text byte and 64-byte word of the segment.
        let mut steps = 0;
        let pattern = format!("*{}?b*", "a".repeat(30_000));
        assert!(!glob_match_counted(pattern.as_bytes(), command.as_bytes(), &mut steps));
        let words = 30_002u64.div_ceil(64);
        assert!(steps <= 60_000 * words + 30_002, "{steps} steps");
    }

    #[test]
    fn rule_paths_walk_objects_and_arrays() {
        let input = json!({"command": "ls", "argv": ["git", "push", 1, true], "nested": {"list": [{"x": "deep"}]}, "n": 3, "mixed": ["a", {"b": 1}]});
        assert_eq!(text_at(&input, "command").as_deref(), Some("ls"));
        assert_eq!(text_at(&input, "argv").as_deref(), Some("git push 1 true"));
        assert_eq!(text_at(&input, "argv.1").as_deref(), Some("push"));
        assert_eq!(text_at(&input, "nested.list.0.x").as_deref(), Some("deep"));
        assert_eq!(text_at(&input, "n"), None);
        assert_eq!(text_at(&input, "mixed"), None);
        assert_eq!(text_at(&input, "missing"), None);
        assert_eq!(text_at(&input, "argv.x"), None);
    }

    #[test]
    fn r68_evaluation_deny_over_ask_over_allow() {
        let rules = json!([
            {"tool": "bash", "verdict": "allow"},
            {"tool": "bash|start_process", "path": "command", "match": "*rm -rf /*", "verdict": "deny", "reason": "first"},
            {"tool": "bash", "path": "command", "match": "*rm*", "verdict": "deny", "reason": "second"},
            {"tool": "bash", "path": "command", "match": "git push*", "verdict": "ask"},
        ]);
        let eval = |tool: &str, input: Value| evaluate(&rules, tool, &input, CallOrigin::Model);
        assert_eq!(eval("bash", json!({"command": "ls"})), Some(RuleMatch { verdict: Verdict::Allow, reason: None }));
        assert_eq!(
            eval("bash", json!({"command": "rm -rf /"})),
            Some(RuleMatch { verdict: Verdict::Deny, reason: Some("first".into()) })
        );
        assert_eq!(eval("bash", json!({"command": "git push"})).map(|m| m.verdict), Some(Verdict::Ask));
        assert_eq!(eval("start_process", json!({"command": "ls"})), None);
        assert_eq!(eval("bash", json!({"command": ["rm", "-rf", "/tmp"]})).map(|m| m.verdict), Some(Verdict::Deny));
        assert_eq!(evaluate(&Value::Null, "bash", &json!({}), CallOrigin::Model), None);
    }

    #[test]
    fn deny_reason_is_cut_to_256_bytes() {
        let rules = json!([{"tool": "*", "verdict": "deny", "reason": "é".repeat(200)}]);
        let reason = evaluate(&rules, "x", &json!({}), CallOrigin::Model).and_then(|m| m.reason).expect("reason");
        assert_eq!(reason.len(), 256);
        assert!(reason.chars().all(|c| c == 'é'));
    }

    #[test]
    fn r67_mode_table() {
        let rules = json!([
            {"tool": "deny_me", "verdict": "deny", "reason": "no"},
            {"tool": "allow_me", "verdict": "allow"},
            {"tool": "ask_me", "verdict": "ask"},
        ]);
        let denied = Decision::Deny { reason: Some("no".into()) };
        let rows = [
            (ApprovalMode::Bypass, "deny_me", denied.clone()),
            (ApprovalMode::Bypass, "allow_me", Decision::Grant(GrantOrigin::Mode)),
            (ApprovalMode::Bypass, "ask_me", Decision::Grant(GrantOrigin::Mode)),
            (ApprovalMode::Bypass, "other", Decision::Grant(GrantOrigin::Mode)),
            (ApprovalMode::Ask, "deny_me", denied.clone()),
            (ApprovalMode::Ask, "allow_me", Decision::Grant(GrantOrigin::Rule)),
            (ApprovalMode::Ask, "ask_me", Decision::Park),
            (ApprovalMode::Ask, "other", Decision::Park),
            (ApprovalMode::Rules, "deny_me", denied),
            (ApprovalMode::Rules, "allow_me", Decision::Grant(GrantOrigin::Rule)),
            (ApprovalMode::Rules, "ask_me", Decision::Park),
            (ApprovalMode::Rules, "other", Decision::Deny { reason: Some("no approval rule allows other".into()) }),
        ];
        for (mode, tool, expected) in rows {
            assert_eq!(decide(mode, &rules, tool, &json!({}), CallOrigin::Model), expected, "{mode:?} {tool}");
        }
    }

    #[test]
    fn r69_author_and_kernel_pre_approved_unless_named() {
        let rules = json!([
            {"tool": "*", "verdict": "deny"},
            {"tool": "hook", "verdict": "ask", "origin": "kernel"},
            {"tool": "cleanup", "verdict": "deny", "origin": "author", "reason": "not here"},
            {"tool": "allowed", "verdict": "allow", "origin": "author"},
        ]);
        let decide_as = |tool: &str, origin| decide(ApprovalMode::Rules, &rules, tool, &json!({}), origin);
        assert_eq!(decide_as("anything", CallOrigin::Kernel), Decision::Grant(GrantOrigin::Kernel));
        assert_eq!(decide_as("anything", CallOrigin::Author), Decision::Grant(GrantOrigin::Author));
        assert_eq!(decide_as("allowed", CallOrigin::Author), Decision::Grant(GrantOrigin::Author));
        assert_eq!(decide_as("hook", CallOrigin::Kernel), Decision::Park);
        assert_eq!(decide_as("cleanup", CallOrigin::Author), Decision::Deny { reason: Some("not here".into()) });
        assert_eq!(decide_as("anything", CallOrigin::Model), Decision::Deny { reason: None });
        assert_eq!(GrantOrigin::Kernel.as_str(), "kernel");
    }
}
